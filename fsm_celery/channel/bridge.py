"""The ack bridge: hands acks and heartbeats from Redis to Celery in batches.

Two sources feed it. The seed's pub/sub channel delivers only while the bridge listens. The
stream is durable: entries are read through a consumer group and acknowledged (XACK) only once
their batch is on the Celery broker, so a bridge that dies leaves them pending, and the next one
claims them (XAUTOCLAIM). Entries written while no bridge runs are read when one starts.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import redis

log = logging.getLogger(__name__)

Submit = Callable[[list[str]], None]
GROUP = "fsm-bridge"


class Pacer:
    """How long to wait for more messages before submitting a batch.

    When the workers keep up (their queue is empty) a batch goes at once, for latency. When
    batches are queuing, a new one would only wait behind them, so it waits here instead and
    grows, up to max_linger: fewer, larger batches, and less work per ack for the workers.
    """

    def __init__(
        self,
        client: redis.Redis,
        queue: str,
        base: float,
        max_linger: float = 0.05,
        per_batch: float = 0.005,
    ) -> None:
        self.client, self.queue = client, queue
        self.base, self.max_linger, self.per_batch = base, max_linger, per_batch
        self._backlog, self._read_at = 0, 0.0

    def linger(self) -> float:
        now = time.monotonic()
        if now - self._read_at > 0.005:
            self._backlog = int(self.client.llen(self.queue))
            self._read_at = now
        return min(self.max_linger, self.base + self._backlog * self.per_batch)


class Source:
    """One place messages come from; `serve` runs until stop, raising on connection loss."""

    name = "source"

    def serve(self, stop: threading.Event) -> None:
        raise NotImplementedError


class AckBridge:
    """Runs each source on its own thread, reconnecting with backoff when Redis goes away."""

    def __init__(self, sources: list[Source]) -> None:
        self.sources = sources

    def run(self, stop: threading.Event) -> None:
        """Serve every source until stop is set."""
        threads = [
            threading.Thread(target=_keep_serving, args=(s, stop), name=s.name, daemon=True)
            for s in self.sources
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()


def _keep_serving(source: Source, stop: threading.Event) -> None:
    delay = 0.1
    while not stop.is_set():
        try:
            source.serve(stop)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.warning("%s lost Redis (%s); reconnecting in %.1fs", source.name, exc, delay)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
        except Exception:
            log.exception("%s failed; restarting it in %.1fs", source.name, delay)
            stop.wait(delay)
            delay = min(delay * 2, 5.0)
        else:
            delay = 0.1


class PubSubSource(Source):
    """The seed's channel: SUBSCRIBE, then submit what arrives in batches."""

    name = "pubsub"

    def __init__(
        self,
        client: redis.Redis,
        channel: str,
        submit: Submit,
        batch: int,
        pacer: Pacer,
        max_bytes: int,
    ) -> None:
        self.client, self.channel, self.submit = client, channel, submit
        self.batch, self.pacer, self.max_bytes = batch, pacer, max_bytes

    def serve(self, stop: threading.Event) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(self.channel)
            log.info("ack bridge subscribed to %s", self.channel)
            while not stop.is_set():
                batch = self._collect(pubsub)
                if batch:
                    self.submit(batch)
        finally:
            pubsub.close()

    def _collect(self, pubsub: redis.client.PubSub) -> list[str]:
        first = pubsub.get_message(timeout=0.5)
        if first is None:
            return []
        batch = [clip(first["data"], self.max_bytes)]
        until = time.monotonic() + self.pacer.linger()
        while len(batch) < self.batch:
            message = pubsub.get_message(timeout=max(until - time.monotonic(), 0.0))
            if message is None:
                break
            batch.append(clip(message["data"], self.max_bytes))
        return batch


class StreamSource(Source):
    """The durable path: XREADGROUP, submit, then XACK and XDEL; XAUTOCLAIM what others left."""

    name = "stream"

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        submit: Submit,
        batch: int,
        max_bytes: int,
        pacer: Pacer,
        claim_idle_ms: int = 30_000,
    ) -> None:
        self.client, self.stream, self.submit = client, stream, submit
        self.batch, self.max_bytes, self.claim_idle_ms = batch, max_bytes, claim_idle_ms
        self.pacer = pacer
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._next_claim = 0.0

    def serve(self, stop: threading.Event) -> None:
        self._ensure_group()
        log.info("ack bridge reading stream %s as %s", self.stream, self.consumer)
        while not stop.is_set():
            try:
                entries = self._claim() or self._read()
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._ensure_group()  # the stream or its group vanished (FLUSHALL): start again
                continue
            if entries:
                self.submit(
                    [clip(fields.get(b"message", b""), self.max_bytes) for _, fields in entries]
                )
                ids = [entry_id for entry_id, _ in entries]
                pipe = self.client.pipeline(transaction=False)
                pipe.xack(self.stream, GROUP, *ids)
                pipe.xdel(self.stream, *ids)
                pipe.execute()

    def _ensure_group(self) -> None:
        try:
            self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _claim(self) -> list[tuple[bytes, dict[bytes, bytes]]]:
        now = time.monotonic()
        if now < self._next_claim:
            return []
        self._next_claim = now + self.claim_idle_ms / 2000
        found: Any = self.client.xautoclaim(
            self.stream, GROUP, self.consumer, self.claim_idle_ms, "0-0", count=self.batch
        )
        return [(entry_id, fields) for entry_id, fields in found[1] if fields]

    def _read(self) -> list[tuple[bytes, dict[bytes, bytes]]]:
        entries = self._next(self.batch, 500)
        if not entries:
            return []
        until = time.monotonic() + self.pacer.linger()
        while len(entries) < self.batch:
            left_ms = int((until - time.monotonic()) * 1000)
            more = self._next(self.batch - len(entries), left_ms) if left_ms > 0 else []
            if not more:
                break
            entries.extend(more)
        return entries

    def _next(self, count: int, block_ms: int) -> list[tuple[bytes, dict[bytes, bytes]]]:
        found: Any = self.client.xreadgroup(
            GROUP, self.consumer, {self.stream: ">"}, count=count, block=block_ms
        )
        return list(found[0][1]) if found else []


def clip(data: bytes | str, max_bytes: int) -> str:
    """The payload as text, cut just past the size limit so the engine rejects it as oversized."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "replace")
    return raw[: max_bytes + 1].decode("utf-8", "replace")
