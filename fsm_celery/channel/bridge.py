"""The ack bridge: subscribes to channel:state:ack and hands acks to Celery in batches."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

import redis

log = logging.getLogger(__name__)

Submit = Callable[[list[str]], None]


class AckBridge:
    """Reads acks from Redis pub/sub and submits them in batches of at most batch_size."""

    def __init__(
        self,
        client: redis.Redis,
        channel: str,
        submit: Submit,
        batch_size: int = 200,
        linger_seconds: float = 0.002,
    ) -> None:
        self.client = client
        self.channel = channel
        self.submit = submit
        self.batch_size = batch_size
        self.linger_seconds = linger_seconds
        self.submitted = 0

    def run(self, stop: threading.Event) -> None:
        """Serve until stop is set, reconnecting when Redis goes away."""
        delay = 0.1
        while not stop.is_set():
            try:
                self._serve(stop)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("ack bridge lost Redis (%s); reconnecting in %.1fs", exc, delay)
                stop.wait(delay)
                delay = min(delay * 2, 5.0)
            else:
                delay = 0.1

    def _serve(self, stop: threading.Event) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(self.channel)
            log.info("ack bridge subscribed to %s", self.channel)
            while not stop.is_set():
                batch = self._collect(pubsub)
                if batch:
                    self.submit(batch)
                    self.submitted += len(batch)
        finally:
            pubsub.close()

    def _collect(self, pubsub: redis.client.PubSub) -> list[str]:
        first = pubsub.get_message(timeout=0.5)
        if first is None:
            return []
        batch = [_text(first["data"])]
        until = time.monotonic() + self.linger_seconds
        while len(batch) < self.batch_size:
            left = until - time.monotonic()
            message = pubsub.get_message(timeout=max(left, 0.0))
            if message is None:
                break
            batch.append(_text(message["data"]))
        return batch


def _text(data: bytes | str) -> str:
    return data.decode("utf-8", "replace") if isinstance(data, bytes) else data
