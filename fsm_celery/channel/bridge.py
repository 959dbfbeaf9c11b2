"""The ack bridge: reads acks and heartbeats from Redis and applies them, batch by batch.

Two sources feed it. The seed's pub/sub channel delivers only while the bridge listens. The
stream is durable: entries are read through a consumer group and acknowledged (XACK) only once
the transaction that applied them has committed, so a bridge that dies leaves them pending; it
reads its own pending entries first when it serves again, and other bridges claim what a dead
one left (XAUTOCLAIM). Entries written while no bridge runs are read when one starts.

A batch is whatever arrived while the previous one was being applied, without waiting for more:
small when the load is light, so an ack is applied at once, and larger as the load grows, so
each ack costs less. Several bridges (or `--processes`) share the stream's consumer group.
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

Apply = Callable[[list[str]], None]
Entries = list[tuple[bytes, dict[bytes, bytes]]]
GROUP = "fsm-bridge"


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
    """The seed's channel: SUBSCRIBE, then apply what arrives, batch by batch."""

    name = "pubsub"

    def __init__(
        self, client: redis.Redis, channel: str, apply: Apply, batch: int, max_bytes: int
    ) -> None:
        self.client, self.channel, self.apply = client, channel, apply
        self.batch, self.max_bytes = batch, max_bytes

    def serve(self, stop: threading.Event) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(self.channel)
            log.info("ack bridge subscribed to %s", self.channel)
            while not stop.is_set():
                batch = self._collect(pubsub)
                if batch:
                    self.apply(batch)
        finally:
            pubsub.close()

    def _collect(self, pubsub: redis.client.PubSub) -> list[str]:
        """The next message, waiting for it, and those already received behind it."""
        message = pubsub.get_message(timeout=0.5)
        batch: list[str] = []
        while message is not None:
            batch.append(clip(message["data"], self.max_bytes))
            if len(batch) >= self.batch:
                break
            message = pubsub.get_message(timeout=0.0)
        return batch


class StreamSource(Source):
    """The durable path: XREADGROUP, apply, then XACK and XDEL; XAUTOCLAIM what others left."""

    name = "stream"

    def __init__(
        self,
        client: redis.Redis,
        stream: str,
        apply: Apply,
        batch: int,
        max_bytes: int,
        claim_idle_ms: int = 30_000,
    ) -> None:
        self.client, self.stream, self.apply = client, stream, apply
        self.batch, self.max_bytes, self.claim_idle_ms = batch, max_bytes, claim_idle_ms
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self._next_claim = 0.0
        self._done: list[bytes] = []  # applied and committed; XACKed with the next read

    def serve(self, stop: threading.Event) -> None:
        self._ensure_group()
        log.info("ack bridge reading stream %s as %s", self.stream, self.consumer)
        own = True  # first what this consumer read before and did not finish (a lost connection)
        while not stop.is_set():
            try:
                entries = self._read("0") if own else self._claim() or self._gather()
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._ensure_group()  # the stream or its group vanished (FLUSHALL): start again
                continue
            own = own and bool(entries)
            if entries:
                self._apply(entries)
        self._acknowledge(self.client.pipeline(transaction=False)).execute()
        self._done = []

    def _apply(self, entries: Entries) -> None:
        """Apply the entries that still hold a message; once committed, they are XACKed and
        XDELed in the same round trip as the next read."""
        payloads = [clip(fields[b"message"], self.max_bytes) for _, fields in entries if fields]
        if payloads:
            self.apply(payloads)
        self._done.extend(entry_id for entry_id, _ in entries)

    def _ensure_group(self) -> None:
        try:
            self.client.xgroup_create(self.stream, GROUP, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def _claim(self) -> Entries:
        now = time.monotonic()
        if now < self._next_claim:
            return []
        self._next_claim = now + self.claim_idle_ms / 2000
        found: Any = self.client.xautoclaim(
            self.stream, GROUP, self.consumer, self.claim_idle_ms, "0-0", count=self.batch
        )
        return [(entry_id, fields) for entry_id, fields in found[1] if fields]

    def _gather(self) -> Entries:
        """New entries, waiting for them. A read woken by an entry returns it alone, though the
        same burst (an agent's pipeline, several agents at once) is often still arriving: one
        more read, without waiting, picks it up, so that it shares this transaction instead of
        paying for one of its own after it."""
        entries = self._read(">", 500)
        if len(entries) == 1:
            entries += self._read(">")
        return entries

    def _read(self, start: str, block_ms: int | None = None) -> Entries:
        """New entries (">", waiting up to block_ms) or this consumer's pending ones ("0"),
        after acknowledging those applied since the last read."""
        pipe = self._acknowledge(self.client.pipeline(transaction=False))
        pipe.xreadgroup(
            GROUP, self.consumer, {self.stream: start}, count=self.batch, block=block_ms
        )
        found: Any = pipe.execute()[-1]
        self._done = []
        return [(i, f or {}) for i, f in found[0][1]] if found else []

    def _acknowledge(self, pipe: redis.client.Pipeline) -> redis.client.Pipeline:
        """Add the XACK and XDEL of the entries applied since the last read to the pipeline."""
        if self._done:
            pipe.xack(self.stream, GROUP, *self._done)
            pipe.xdel(self.stream, *self._done)
        return pipe


def clip(data: bytes | str, max_bytes: int) -> str:
    """The payload as text, cut just past the size limit so the engine rejects it as oversized."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "replace")
    return raw[: max_bytes + 1].decode("utf-8", "replace")
