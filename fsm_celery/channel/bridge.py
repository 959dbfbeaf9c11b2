"""The ack bridge: reads acks and heartbeats from Redis and applies them, batch by batch.

Where a message comes from says who sent it. Each agent writes to its own ack stream,
`stream:state:ack:<agent id>`, which under the Redis ACLs (`fsm-celery agents credentials`) only
it may write: the engine takes the sender from the stream's name, never from the payload. The
seed's shared channel and the shared stream carry no identity; they are read only while
FSM_ACCEPT_SHARED_ACKS allows them (on by default, for agents written against the seed).

Streams are durable: entries are read through a consumer group and acknowledged (XACK) only
once the transaction that applied them has committed, so a bridge that dies leaves them pending;
it reads its own pending entries first when it serves again, and other bridges claim what a dead
one left (XAUTOCLAIM). Nothing one message does can stall the others:
- a read is bounded in entries and in bytes of every field, inside Redis (read_acks.lua): an
  entry over the payload limit never leaves Redis (it is parked by its id and size), and an
  idle bridge is woken by a notification that names the stream, never by the entry
  (channel/wakeup.py);
- streams are read round robin, so an agent that floods its own stream gets a share of each
  batch, and a stream longer than FSM_ACK_STREAM_MAXLEN is trimmed;
- a message that can be neither applied nor recorded as rejected is kept pending and tried
  again; after FSM_DEAD_LETTER_AFTER tries it is parked in the dead-letter stream
  (`fsm-celery rejected --parked` shows it) and acknowledged, so the stream moves on.

A batch is whatever arrived while the previous one was being applied, without waiting for more:
small when the load is light, so an ack is applied at once, and larger as the load grows, so
each ack costs less. Several bridges (or `--processes`) share each stream's consumer group.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, NamedTuple

import redis

from fsm_celery.channel.wakeup import Wakeup
from fsm_celery.core.messages import AGENT_ACK_STREAM
from fsm_celery.engine import Inbound

log = logging.getLogger(__name__)

Apply = Callable[[list[Inbound]], list[Inbound]]  # returns what could not be applied
GROUP = "fsm-bridge"
DEAD_STREAM = "stream:state:dead"
ALIVE_KEY = "bridge:alive:{consumer}"  # set by each bridge process every upkeep, expiring
DEAD_MAXLEN = 10_000
READ_BUDGET = 16 * 1024 * 1024  # bytes of entries one read may load in Redis (+ STREAM_CAP)
STREAM_CAP = 16 * 1024 * 1024  # a larger ack stream (or 4 entries at the limit) is dropped unread
ENTRY_NAMES = 1024  # bytes an entry may hold beyond its message: field names, small extras
CRASH_DELIVERIES = 10  # reads of an entry never answered: it brought the bridge down each time
MAINTAIN_SECONDS = 2.0  # how often new agent streams are looked for and long ones trimmed
_READ = (Path(__file__).parent / "read_acks.lua").read_text()


class Backoff:
    """A reconnect delay that doubles up to a cap, and starts again once things work."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first, self.cap, self.delay = first, cap, first

    def next(self) -> float:
        """The delay to wait now; the one after it is twice as long."""
        delay = self.delay
        self.delay = min(self.delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.delay = self.first


class Source:
    """One place messages come from; `serve` runs until stop, raising on connection loss."""

    name = "source"

    def serve(self, stop: threading.Event, backoff: Backoff) -> None:
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
    backoff = Backoff()  # the source resets it after each read that works
    while not stop.is_set():
        try:
            source.serve(stop, backoff)
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            delay = backoff.next()
            log.warning("%s lost Redis (%s); reconnecting in %.1fs", source.name, exc, delay)
            stop.wait(delay)
        except Exception:
            delay = backoff.next()
            log.exception("%s failed; restarting it in %.1fs", source.name, delay)
            stop.wait(delay)


def apply_until_done(apply: Apply, batch: list[Inbound], stop: threading.Event) -> list[Inbound]:
    """Apply the batch, trying again with backoff while the database or Redis is away (the
    batch stays in hand: nothing is read again, nothing counts as a failed try)."""
    from fsm_celery.batches import TRANSIENT

    backoff = Backoff()
    while True:
        try:
            return apply(batch)
        except TRANSIENT as exc:
            if stop.is_set():
                raise
            delay = backoff.next()
            log.warning("could not apply a batch (%s); trying again in %.1fs", exc, delay)
            stop.wait(delay)


class DeadLetters:
    """The stream where messages that could not be applied are parked, with the reason."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.stream = prefix + DEAD_STREAM

    def park(self, pipe: Any, raw: str, source: str, reason: str) -> None:
        """Add the message to the dead-letter stream (in the caller's pipeline)."""
        fields = {
            "message": raw,
            "source": source,
            "reason": reason,
            "parkedAt": datetime.now(UTC).isoformat(),
        }
        pipe.xadd(self.stream, fields, maxlen=DEAD_MAXLEN, approximate=True)

    def latest(self, limit: int) -> list[dict[str, str]]:
        """The most recently parked messages, newest first."""
        found: Any = self.client.xrevrange(self.stream, count=limit)
        return [
            {"id": _text(entry_id), **{_text(k): _text(v) for k, v in fields.items()}}
            for entry_id, fields in found
        ]


class PubSubSource(Source):
    """The seed's channel: SUBSCRIBE, then apply what arrives, batch by batch."""

    name = "pubsub"

    def __init__(
        self,
        client: redis.Redis,
        channel: str,
        apply: Apply,
        dead: DeadLetters,
        batch: int,
        max_bytes: int,
        linger: float = 0.0,
    ) -> None:
        self.client, self.channel, self.apply, self.dead = client, channel, apply, dead
        self.batch, self.max_bytes, self.linger = batch, max_bytes, linger

    def serve(self, stop: threading.Event, backoff: Backoff) -> None:
        pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        try:
            pubsub.subscribe(self.channel)
            log.info("ack bridge subscribed to %s", self.channel)
            while not stop.is_set():
                batch = self._collect(pubsub)
                backoff.reset()
                if batch:
                    self._park(apply_until_done(self.apply, batch, stop))
        finally:
            pubsub.close()

    def _collect(self, pubsub: redis.client.PubSub) -> list[Inbound]:
        """The next message, waiting for it, and those received behind it within the linger."""
        message = pubsub.get_message(timeout=0.5)
        if message is None:
            return []
        deadline = time.monotonic() + self.linger
        batch: list[Inbound] = []
        while True:
            if message is not None:
                batch.append(Inbound(clip(message["data"], self.max_bytes)))
                if len(batch) >= self.batch:
                    return batch
            left = deadline - time.monotonic()
            message = pubsub.get_message(timeout=max(left, 0.0))
            if message is None and left <= 0:
                return batch

    def _park(self, failed: list[Inbound]) -> None:
        """A pub/sub message cannot be read again: one that failed is parked at once."""
        if failed:
            pipe = self.client.pipeline(transaction=False)
            for item in failed:
                self.dead.park(pipe, item.raw, self.channel, "could not be applied nor recorded")
            pipe.execute()


class Entry(NamedTuple):
    """One stream entry read for the bridge."""

    stream: str
    entry_id: bytes
    item: Inbound | None  # None: deleted, or no message field
    deliveries: int


class StreamSource(Source):
    """The durable path: the agents' own ack streams (and the shared one, if accepted) read
    through one consumer group; XACK and XDEL once applied; XAUTOCLAIM what others left."""

    name = "stream"

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        apply: Apply,
        dead: DeadLetters,
        *,
        shared: bool,
        batch: int,
        max_bytes: int,
        claim_idle_ms: int = 30_000,
        dead_letter_after: int = 3,
        maxlen: int = 100_000,
        linger: float = 0.0,
    ) -> None:
        self.client, self.prefix, self.apply, self.dead = client, prefix, apply, dead
        self.shared = prefix + "stream:state:ack" if shared else None
        self.batch, self.max_bytes, self.claim_idle_ms = batch, max_bytes, claim_idle_ms
        self.dead_letter_after, self.maxlen, self.linger = dead_letter_after, maxlen, linger
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self.streams: list[str] = []
        self._agents: dict[str, uuid.UUID | None] = {}  # stream -> the agent that writes it
        self._read = client.register_script(_READ)
        self._wakeup = Wakeup(client, prefix)
        self._turn = 0
        self._next_claim = 0.0
        self._next_upkeep = 0.0
        self._done: list[tuple[str, bytes]] = []  # applied and committed; XACKed on next read
        self._failures: dict[tuple[str, bytes], int] = {}
        self._pending = True  # read this consumer's pending entries (at start, after a failure)

    def serve(self, stop: threading.Event, backoff: Backoff) -> None:
        self._next_upkeep = 0.0
        self._pending = True
        self._wakeup.close()  # a Redis started again forgot its notification flags
        log.info("ack bridge reading the ack streams as %s", self.consumer)
        while not stop.is_set():
            self._upkeep()
            if not self.streams:
                stop.wait(MAINTAIN_SECONDS)
                continue
            try:
                entries = self._next_entries()
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._regroup()  # a stream or its group vanished (FLUSHALL): set them up again
                self._pending = True  # what the failed read had delivered is pending: read it
                continue
            backoff.reset()
            if entries:
                self._apply(entries, stop)
        self._acknowledge(self.client.pipeline(transaction=False)).execute()
        self._done = []

    def _next_entries(self) -> list[Entry]:
        if self._pending:
            entries = self._fetch("0")
            self._pending = bool(entries)
            return entries
        if self._claim():
            self._pending = True
            return []
        entries = self._fetch(">")
        if not entries:
            self._wakeup.wait(0.5)
            return []
        if self.linger and len(entries) < self.batch:
            time.sleep(self.linger)  # let a batch worth its task gather
            entries += self._fetch(">", self.batch - len(entries))
        return entries

    def _apply(self, entries: list[Entry], stop: threading.Event) -> None:
        """Apply the entries that hold a message; once committed, they are XACKed and XDELed
        in the same round trip as the next read. What could not be applied stays pending."""
        crashed = [e for e in entries if e.item is not None and e.deliveries > CRASH_DELIVERIES]
        if crashed:
            self._park(crashed, f"read {CRASH_DELIVERIES} times and never answered")
        todo = [e for e in entries if e.item is not None and e not in crashed]
        failed = apply_until_done(self.apply, [e.item for e in todo if e.item], stop)
        kept = {id(item) for item in failed}
        for entry in entries:
            if entry.item is None or id(entry.item) not in kept:
                self._done.append((entry.stream, entry.entry_id))
                self._failures.pop((entry.stream, entry.entry_id), None)
        self._retry_or_park([e for e in todo if e.item is not None and id(e.item) in kept])

    def _retry_or_park(self, failed: list[Entry]) -> None:
        parked = []
        for entry in failed:
            key = (entry.stream, entry.entry_id)
            self._failures[key] = self._failures.get(key, 0) + 1
            if self._failures[key] >= self.dead_letter_after:
                parked.append(entry)
                del self._failures[key]
        if parked:
            self._park(parked, f"could not be applied nor recorded {self.dead_letter_after} times")
        if len(parked) < len(failed):
            self._pending = True  # read them again (from this consumer's pending entries)

    def _park(self, entries: list[Entry], reason: str) -> None:
        pipe = self.client.pipeline(transaction=False)
        for entry in entries:
            assert entry.item is not None
            self.dead.park(pipe, entry.item.raw, entry.stream, reason)
            pipe.xack(entry.stream, GROUP, entry.entry_id)
            pipe.xdel(entry.stream, entry.entry_id)
        pipe.execute()
        log.error("parked %d message(s) in %s: %s", len(entries), self.dead.stream, reason)

    # reading ----------------------------------------------------------------------------

    def _fetch(self, mode: str, count: int | None = None) -> list[Entry]:
        """New entries (">") or this consumer's pending ones ("0"), after acknowledging those
        applied since the last read; at most a batch, and at most READ_BUDGET bytes loaded
        in Redis, plus at most one stream under its cap read entry by entry. Entries over the
        limit, and streams over the cap, are parked there, never read."""
        if not self.streams:  # the last one was dropped by the read before
            return []
        pipe = self._acknowledge(self.client.pipeline(transaction=False))
        self._turn = self._turn % len(self.streams) + 1
        count = count or self.batch
        limit = self.max_bytes + ENTRY_NAMES
        cap = max(STREAM_CAP, 4 * limit)
        args = (GROUP, self.consumer, mode, count, READ_BUDGET, self._turn, limit, cap)
        keys = [*self.streams, self.dead.stream]
        # EVALSHA, not the Script object: in a pipeline that asks SCRIPT EXISTS first, a
        # round trip more per read. Redis forgets scripts when it restarts: load it again then.
        pipe.evalsha(self._read.sha, len(keys), *keys, *args)
        try:
            found, parked, _touched = pipe.execute()[-1]
        except redis.exceptions.NoScriptError:
            self.client.script_load(_READ)
            return self._fetch(mode, count)
        self._done = []
        entries = [self._entry(*found[i : i + 4]) for i in range(0, len(found), 4)]
        self._forget([self._parked(*parked[i : i + 3]) for i in range(0, len(parked), 3)])
        return entries

    def _parked(self, index: int, entry_id: bytes | None, size: int) -> str | None:
        """Say what the read script parked unread; the stream, when it dropped all of it."""
        stream = self.streams[index - 1]
        what = f"{stream} {_text(entry_id)}" if entry_id else f"the whole of {stream}"
        log.error("parked %s (%d bytes) in %s, never read", what, size, self.dead.stream)
        return None if entry_id else stream

    def _forget(self, dropped: list[str | None]) -> None:
        """Stop reading the streams the script dropped (upkeep finds them again if written)."""
        for stream in dropped:
            if stream is not None and stream in self._agents:
                del self._agents[stream]
                self.streams.remove(stream)

    def _entry(self, index: int, entry_id: bytes, raw: bytes | None, deliveries: int) -> Entry:
        stream = self.streams[index - 1]
        item = None if raw is None else Inbound(clip(raw, self.max_bytes), self._agents[stream])
        return Entry(stream, entry_id, item, deliveries)

    def _claim(self) -> bool:
        """Take over entries another consumer left pending (it died); whether any were."""
        now = time.monotonic()
        if now < self._next_claim:
            return False
        self._next_claim = now + self.claim_idle_ms / 2000
        pipe = self.client.pipeline(transaction=False)
        for stream in self.streams:
            pipe.xautoclaim(
                stream, GROUP, self.consumer, self.claim_idle_ms, "0-0", self.batch, justid=True
            )
        return any(claimed_ids(reply) for reply in pipe.execute(raise_on_error=False))

    def _acknowledge(self, pipe: Any) -> Any:
        """Add the XACK and XDEL of the entries applied since the last read to the pipeline."""
        by_stream: dict[str, list[bytes]] = {}
        for stream, entry_id in self._done:
            by_stream.setdefault(stream, []).append(entry_id)
        for stream, ids in by_stream.items():
            pipe.xack(stream, GROUP, *ids)
            pipe.xdel(stream, *ids)
        return pipe

    # the streams ------------------------------------------------------------------------

    def _upkeep(self) -> None:
        """Every few seconds: find the agents' ack streams (an agent's first message creates
        its stream), give each the bridge's consumer group, and trim those that grew too long."""
        now = time.monotonic()
        if now < self._next_upkeep:
            return
        self._next_upkeep = now + MAINTAIN_SECONDS
        alive = self.prefix + ALIVE_KEY.format(consumer=self.consumer)
        self.client.set(alive, str(os.getpid()), ex=round(MAINTAIN_SECONDS * 5))  # doctor
        found = self._discover()
        pipe = self.client.pipeline(transaction=False)
        for stream in found:
            if stream not in self._agents:
                pipe.xgroup_create(stream, GROUP, id="0", mkstream=True)
        for stream in found:
            pipe.xlen(stream)
        replies = pipe.execute(raise_on_error=False)
        for reply in replies[: len(replies) - len(found)]:
            if not _ok(reply) and "BUSYGROUP" not in str(reply):
                raise reply
        self._agents = {s: self._agents.get(s, _agent_of(s, self.prefix)) for s in found}
        self.streams = sorted(found)
        self._trim(dict(zip(found, replies[len(replies) - len(found) :], strict=True)))

    def _regroup(self) -> None:
        self._agents = {}
        self._next_upkeep = 0.0
        self._upkeep()

    def _discover(self) -> list[str]:
        pattern = _glob_escape(self.prefix + AGENT_ACK_STREAM.format(agent="")) + "*"
        found = {
            _text(key)
            for key in self.client.scan_iter(match=pattern, count=1000, _type="stream")
            if _agent_of(_text(key), self.prefix) is not None
        }
        if self.shared is not None:
            found.add(self.shared)
        return sorted(found)

    def _trim(self, lengths: dict[str, Any]) -> None:
        for stream, length in lengths.items():
            if isinstance(length, int) and length > self.maxlen:
                self.client.xtrim(stream, maxlen=self.maxlen, approximate=True)
                log.warning(
                    "%s held %d entries, over FSM_ACK_STREAM_MAXLEN=%d: the oldest were dropped",
                    stream,
                    length,
                    self.maxlen,
                )


def _agent_of(stream: str, prefix: str) -> uuid.UUID | None:
    """The agent whose own ack stream this is (None for the shared one, or a foreign key)."""
    head = prefix + AGENT_ACK_STREAM.format(agent="")
    if not stream.startswith(head):
        return None
    try:
        return uuid.UUID(stream[len(head) :])
    except ValueError:
        return None


def _glob_escape(text: str) -> str:
    return "".join("\\" + c if c in "*?[]\\" else c for c in text)


def _ok(reply: Any) -> bool:
    return not isinstance(reply, Exception)


def claimed_ids(reply: Any) -> list[bytes]:
    """The entry ids an XAUTOCLAIM ... JUSTID took over. redis-py 8 returns the ids alone;
    earlier versions, in a pipeline, the whole reply: [next cursor, ids, deleted ids]."""
    if not _ok(reply) or not reply:
        return []
    if len(reply) >= 2 and isinstance(reply[1], list | tuple):
        return list(reply[1])
    return list(reply)


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value


def clip(data: bytes | str, max_bytes: int) -> str:
    """The payload as text, cut just past the size limit so the engine rejects it as oversized."""
    raw = data if isinstance(data, bytes) else data.encode("utf-8", "replace")
    return raw[: max_bytes + 1].decode("utf-8", "replace")
