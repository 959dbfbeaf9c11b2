"""The Redis pub/sub side of the seed protocol."""

from __future__ import annotations

import redis


class RedisPublisher:
    """Publishes state_task messages with PUBLISH."""

    def __init__(self, client: redis.Redis) -> None:
        self._client = client

    def publish(self, channel: str, message: str) -> int:
        return int(self._client.publish(channel, message))


def connect(url: str) -> redis.Redis:
    """A Redis client that retries briefly on connection errors."""
    return redis.Redis.from_url(url, health_check_interval=30, socket_keepalive=True)
