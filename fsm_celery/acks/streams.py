"""The durable path: the agents' own ack streams (and the shared one, if accepted) read
through one consumer group.

Where a message comes from says who sent it. Each agent writes to its own ack stream,
`stream:state:ack:<agent id>`, which under the Redis ACLs (`fsm-celery agents credentials`) only
it may write: the engine takes the sender from the stream's name, never from the payload. The
seed's shared stream carries no identity; it is read only while FSM_ACCEPT_SHARED_ACKS allows it.

Entries are read through a consumer group and acknowledged (XACK, then XDEL) only once the
transaction that applied them has committed. In the inline mode that is the bridge's, and it
acknowledges them in the same round trip as the next read: a bridge that dies leaves them
pending; it reads its own pending entries first when it serves again, and other bridges claim
what a dead one left (XAUTOCLAIM). In the celery mode it is the worker's that ran the entries'
fsm.apply_acks task, which settles them (acks/settle.py): the bridge leaves what it relayed
pending, and relays again an entry not settled in FSM_RELAY_TIMEOUT_SECONDS, twice as long
after each relay (overdue_acks.lua: whichever bridge, dead or alive, relayed it). Redis counts
each hand-out of an entry (its deliveries): that count is the message's tries for the
dead-letter policy (in the celery mode, its relays). Nothing one message does can stall the
others:
- a read is bounded in entries and in bytes of every field, inside Redis (read_acks.lua): an
  entry over the payload limit never leaves Redis (it is parked by its id and size), and an
  idle bridge is woken by a notification that names the stream, never by the entry
  (acks/wakeup.py);
- streams are read round robin, so an agent that floods its own stream gets a share of each
  batch, and a stream longer than FSM_ACK_STREAM_MAXLEN is trimmed.

A batch is whatever arrived while the previous one was being handled, without waiting for more:
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
from pathlib import Path
from typing import Any

import redis

from fsm_celery.acks.consumer import Envelope
from fsm_celery.acks.dead import DeadLetters
from fsm_celery.acks.wakeup import Wakeup
from fsm_celery.channel.acl import glob_escape
from fsm_celery.core.messages import AGENT_ACK_STREAM
from fsm_celery.engine.ports import Inbound
from fsm_celery.metrics.instruments import count

log = logging.getLogger(__name__)

GROUP = "fsm-bridge"
ALIVE_KEY = "bridge:alive:{consumer}"  # set by each bridge process every upkeep, expiring
READ_BUDGET = 16 * 1024 * 1024  # bytes of entries one read may load in Redis (+ STREAM_CAP)
STREAM_CAP = 16 * 1024 * 1024  # a larger ack stream (or 4 entries at the limit) is dropped unread
ENTRY_NAMES = 1024  # bytes an entry may hold beyond its message: field names, small extras
MAINTAIN_SECONDS = 2.0  # how often new agent streams are looked for and long ones trimmed
RELAY_CAP_MS = 600_000  # the longest a relayed entry waits for its worker, however often relayed
OVERDUE_LOOKED = 1000  # pending entries of a stream one look for overdue ones reads
_READ = (Path(__file__).parent / "read_acks.lua").read_text()
_OVERDUE = (Path(__file__).parent / "overdue_acks.lua").read_text()


class StreamConsumer:
    name = "stream"
    redelivers = True

    def __init__(
        self,
        client: redis.Redis,
        prefix: str,
        dead: DeadLetters,
        *,
        shared: bool,
        batch: int,
        max_bytes: int,
        claim_idle_ms: int = 30_000,
        maxlen: int = 100_000,
        linger: float = 0.0,
        relay_after_ms: int | None = None,
    ) -> None:
        """With `relay_after_ms` (the celery mode), what is handed on stays pending until a
        worker settles it, and is handed out again when overdue; without, what is read is
        finished here."""
        self.client, self.prefix, self.dead = client, prefix, dead
        self.shared = prefix + "stream:state:ack" if shared else None
        self.batch, self.max_bytes, self.claim_idle_ms = batch, max_bytes, claim_idle_ms
        self.maxlen, self.linger, self.relay_after_ms = maxlen, linger, relay_after_ms
        self.consumer = f"{socket.gethostname()}-{os.getpid()}"
        self.streams: list[str] = []
        self._agents: dict[str, uuid.UUID | None] = {}  # stream -> the agent that writes it
        self._read = client.register_script(_READ)
        self._overdue = client.register_script(_OVERDUE)
        self._wakeup = Wakeup(client, prefix)
        self._turn = 0
        self._next_claim = 0.0
        self._next_upkeep = 0.0
        self._done: list[tuple[str, bytes]] = []  # finished; XACKed and XDELed on the next read
        self._pending = True  # read this consumer's pending entries (at start, after a failure)

    def open(self) -> None:
        self._next_upkeep = 0.0
        self._pending = self._reads_pending  # in the celery mode they wait for their workers
        self._wakeup.close()  # a Redis started again forgot its notification flags
        log.info("ack bridge reading the ack streams as %s", self.consumer)

    def read(self, stop: threading.Event) -> list[Envelope]:
        self._upkeep()
        if not self.streams:
            stop.wait(MAINTAIN_SECONDS)
            return []
        try:
            return self._next_entries()
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._regroup()  # a stream or its group vanished (FLUSHALL): set them up again
            self._pending = self._reads_pending  # what the failed read delivered is pending
            return []

    def finish(self, envelopes: list[Envelope]) -> None:
        self._done += [(d.source, d.key) for d in envelopes]

    def hand_on(self, envelopes: list[Envelope]) -> None:
        if not self._reads_pending:
            return  # pending until the worker that applies them settles them (acks/settle.py)
        self.finish(envelopes)

    def retry(self, envelopes: list[Envelope]) -> None:
        if envelopes and self._reads_pending:
            self._pending = True  # read them again (from this consumer's pending entries)
        # in the celery mode they are pending, handed out again once overdue

    @property
    def _reads_pending(self) -> bool:
        """Whether this consumer's pending entries are its own to read again (the inline mode),
        rather than relayed entries waiting for their workers (the celery mode)."""
        return self.relay_after_ms is None

    def park(self, envelopes: list[Envelope], why: str | None = None) -> None:
        if not envelopes:
            return
        pipe = self.client.pipeline(transaction=False)
        self.dead.park(pipe, envelopes, why)
        for envelope in envelopes:
            pipe.xack(envelope.source, GROUP, envelope.key)
            pipe.xdel(envelope.source, envelope.key)
        pipe.execute()
        log.error("parked %d message(s) in %s", len(envelopes), self.dead.stream)

    def close(self) -> None:
        """Acknowledge what was finished since the last read."""
        if self._done:
            self._acknowledge(self.client.pipeline(transaction=False)).execute()
            self._done = []

    def _next_entries(self) -> list[Envelope]:
        if self._pending:
            entries = self._fetch("0")
            self._pending = bool(entries)
            return entries
        if self._reads_pending and self._claim():
            self._pending = True
            return []
        if not self._reads_pending:
            overdue = self._take_overdue()
            if overdue:
                return overdue
        entries = self._fetch(">")
        if not entries:
            self._wakeup.wait(0.5)
            added = self._wakeup.take_added()
            if any(s not in self._agents and _agent_of(s, self.prefix) for s in added):
                self._next_upkeep = 0.0  # an agent's first message: read its stream now
            return []
        if self.linger and len(entries) < self.batch:
            time.sleep(self.linger)  # let a batch worth its task gather
            entries += self._fetch(">", self.batch - len(entries))
        return entries

    # reading ----------------------------------------------------------------------------

    def _fetch(self, mode: str, count: int | None = None) -> list[Envelope]:
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
        return [entry for entry in entries if entry is not None]

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

    def _entry(
        self, index: int, entry_id: bytes, raw: bytes | None, deliveries: int
    ) -> Envelope | None:
        """The entry as an Envelope; None for one deleted or without a message field, which is
        finished at once (nothing to apply)."""
        stream = self.streams[index - 1]
        if raw is None:
            self._done.append((stream, entry_id))
            return None
        stored = int(entry_id.split(b"-", 1)[0]) / 1000  # the entry id's time, in ms
        item = Inbound(clip(raw, self.max_bytes), self._agents[stream], stored)
        return Envelope(item, stream, deliveries, entry_id)

    def _take_overdue(self) -> list[Envelope]:
        """In the celery mode, every half relay timeout: the entries relayed and not settled
        in time, from whichever bridge, taken over to be relayed again (overdue_acks.lua)."""
        now = time.monotonic()
        if now < self._next_claim or self.relay_after_ms is None:
            return []
        self._next_claim = now + self.relay_after_ms / 2000
        self._turn = self._turn % len(self.streams) + 1
        limits = (self.relay_after_ms, RELAY_CAP_MS, self.batch, READ_BUDGET)
        args = (GROUP, self.consumer, *limits, self._turn, OVERDUE_LOOKED)
        try:
            found = self._overdue(keys=self.streams, args=args)
        except redis.ResponseError as exc:
            if "NOGROUP" not in str(exc):
                raise
            self._regroup()
            return []
        entries = [self._entry(*found[i : i + 4]) for i in range(0, len(found), 4)]
        taken = [entry for entry in entries if entry is not None]
        if taken:
            log.warning("%d ack(s) relayed and not applied in time: relayed again", len(taken))
            count("fsm_bridge_messages_total", "relayed_again", by=len(taken))
        return taken

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
        return acknowledge(pipe, self._done)

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
        pattern = glob_escape(self.prefix + AGENT_ACK_STREAM.format(agent="")) + "*"
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


def acknowledge(pipe: Any, entries: list[tuple[str, Any]]) -> Any:
    """Add to the pipeline the XACK and XDEL of these (stream, entry id), a pair of commands
    per stream (the bridge's after it applied them, a worker's after it did: acks/settle.py)."""
    by_stream: dict[str, list[Any]] = {}
    for stream, entry_id in entries:
        by_stream.setdefault(stream, []).append(entry_id)
    for stream, ids in by_stream.items():
        pipe.xack(stream, GROUP, *ids)
        pipe.xdel(stream, *ids)
    return pipe


def _agent_of(stream: str, prefix: str) -> uuid.UUID | None:
    """The agent whose own ack stream this is (None for the shared one, or a foreign key)."""
    head = prefix + AGENT_ACK_STREAM.format(agent="")
    if not stream.startswith(head):
        return None
    try:
        return uuid.UUID(stream[len(head) :])
    except ValueError:
        return None


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
