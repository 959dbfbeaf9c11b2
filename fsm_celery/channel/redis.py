"""The Redis side of the protocol: pub/sub as in the seed, and streams for durable delivery."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

import redis

from fsm_celery.core.messages import StateEvent, events_channel, task_channel, task_stream

log = logging.getLogger(__name__)

STREAM_MAXLEN = 10_000  # tasks kept per agent stream (approximate trimming)
STREAM_TTL_SECONDS = 7 * 24 * 3600  # a stream nobody writes to for a week is dropped
TTL_REFRESH_SECONDS = 60.0  # how often a dispatcher renews the TTL of a stream it writes to


class RedisDispatcher:
    """PUBLISHes each state_task on the agent's channel and XADDs it to the agent's stream.

    A whole batch goes in one pipelined round trip. A pub/sub agent that is down misses the
    message and the state times out and is retried; a stream agent reads what it missed when it
    comes back.
    """

    def __init__(self, client: redis.Redis, prefix: str = "", streams: bool = True) -> None:
        self._client = client
        self._prefix = prefix
        self._streams = streams
        self._renewed: dict[str, float] = {}  # stream -> when its TTL was last set

    def dispatch_many(self, messages: list[tuple[str, str]]) -> None:
        if not messages:
            return
        pipe = self._client.pipeline(transaction=False)
        for agent, message in messages:
            pipe.publish(task_channel(agent, self._prefix), message)
            if self._streams:
                stream = task_stream(agent, self._prefix)
                pipe.xadd(stream, {"message": message}, maxlen=STREAM_MAXLEN, approximate=True)
        if self._streams:
            now = time.monotonic()
            for agent in {agent for agent, _ in messages}:
                stream = task_stream(agent, self._prefix)
                if now - self._renewed.get(stream, -TTL_REFRESH_SECONDS) >= TTL_REFRESH_SECONDS:
                    pipe.expire(stream, STREAM_TTL_SECONDS)
                    self._renewed[stream] = now
        pipe.execute()

    def cancel_many(self, messages: list[tuple[str, str]]) -> None:
        """XADD each state_cancel to the agent's task stream, all in one round trip.

        Not published: agents of the seed's pub/sub protocol would take it for a task.
        """
        if not messages or not self._streams:
            return
        pipe = self._client.pipeline(transaction=False)
        for agent, message in messages:
            stream = task_stream(agent, self._prefix)
            pipe.xadd(stream, {"message": message}, maxlen=STREAM_MAXLEN, approximate=True)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("%d state_cancels not sent: %s", len(messages), exc)

    def announce(self, events: Sequence[StateEvent]) -> None:
        """PUBLISH each event on the events channel, all in one round trip."""
        if not events:
            return
        channel = events_channel(self._prefix)
        pipe = self._client.pipeline(transaction=False)
        for event in events:
            pipe.publish(channel, event.to_wire())
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("%d transition events not announced: %s", len(events), exc)


def connect(url: str) -> redis.Redis:
    """A Redis client with keepalive and health checks."""
    return redis.Redis.from_url(url, health_check_interval=30, socket_keepalive=True)
