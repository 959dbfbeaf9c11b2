"""The celery mode's hand-off of acks, the bridge's end: the bridge relays each batch it read as
fsm.apply_acks tasks (Relay), in the wire format below, and a worker applies each, in one
transaction, handing every state decided on to an fsm.enter_state task (the task:
fsm_celery.worker.tasks).

Agents' status reports are no machine's step: the bridge applies them itself (a small upsert
of the agent registry), so that Flower lists the machines' work and not every agent's report
every few seconds. While the database is away they are relayed with the acks instead, so
that nothing waits on them.

Once Relay returns, the broker holds the batch, but the stream entries stay pending: the worker
settles them once its transaction has applied or recorded them (acks/settle.py). kombu's Redis
transport takes a task in two commands (BRPOP, then its record as unacknowledged), so a Redis
failover between them loses the task: an entry a worker has not settled in
FSM_RELAY_TIMEOUT_SECONDS is relayed again by a bridge (acks/streams.py), a copy applied already
being refused as stale. A failed publish raises a transient error: the bridge keeps the batch
and tries again (a part already published is applied once anyway).
"""

from __future__ import annotations

import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from celery import Celery
from sqlalchemy import Engine

from fsm_celery.acks.bridge import Handled
from fsm_celery.acks.consumer import Envelope
from fsm_celery.channel.transient import TRANSIENT
from fsm_celery.store.queries import type_of_machines_txn
from fsm_celery.traces import relaying

APPLY_ACKS = "fsm.apply_acks"
ACKS_SHOWN = 20  # machines an apply_acks task names in Flower
STATUS_BYTES = 4096  # an agent_status is far smaller: anything larger is relayed as it is

log = logging.getLogger(__name__)

# [message, sender's id or None, source, stored at (unix seconds) or None, stream entry id or
# None, tries] per message (JSON): the entry id is what the worker settles once it applied it
Wire = list[list[str | float | None]]


class Relay:
    """The bridge's handler in the celery mode: each batch becomes fsm.apply_acks tasks on the
    queue, each carrying at most max_bytes of messages. With `route` (FSM_QUEUES), each message
    goes on its machine's queue instead: route maps machine ids (as text, read from the raw
    messages, unchecked: the worker checks them) to queues, those it does not know to `queue`.
    With `statuses`, the agents' status reports are handed to it instead of to a task."""

    def __init__(
        self,
        app: Celery,
        queue: str,
        max_bytes: int,
        route: Callable[[set[str]], dict[str, str]] | None = None,
        statuses: Callable[[list[Envelope]], list[Envelope]] | None = None,
    ) -> None:
        self.app, self.queue, self.max_bytes, self.route = app, queue, max_bytes, route
        self.statuses = statuses

    def __call__(self, batch: list[Envelope]) -> Handled:
        failed, batch = self._apply_statuses(batch)
        if batch:
            self._publish(batch)
        return Handled(failed, batch)

    def _apply_statuses(self, batch: list[Envelope]) -> tuple[list[Envelope], list[Envelope]]:
        """Apply the batch's status reports here; those that failed, and what is to relay."""
        if self.statuses is None:
            return [], batch
        reports = [d for d in batch if is_status(d.item.raw)]
        if not reports:
            return [], batch
        try:
            failed = self.statuses(reports)
        except TRANSIENT as exc:  # the acks must not wait for the database: a worker retries
            log.warning("agents' statuses relayed, not applied here: %s", exc)
            return [], batch
        shown = {id(d) for d in reports}
        return failed, [d for d in batch if id(d) not in shown]

    def _publish(self, batch: list[Envelope]) -> None:
        with self.app.producer_or_acquire() as producer:  # one connection for the whole batch
            for queue, part in self._by_queue(batch):
                for chunk in chunks(part, self.max_bytes):
                    with relaying(chunk):  # traced: under the agent's span that sent an ack
                        self.app.send_task(
                            APPLY_ACKS,
                            (wire(chunk, tries=1),),
                            queue=queue,
                            argsrepr=acks_repr(chunk),
                            producer=producer,
                        )

    def _by_queue(self, batch: list[Envelope]) -> list[tuple[str, list[Envelope]]]:
        if self.route is None:
            return [(self.queue, batch)]
        ids = [machine_id_in(d.item.raw) for d in batch]
        queues = self.route({i for i in ids if i is not None})
        parts: dict[str, list[Envelope]] = {}
        for envelope, mid in zip(batch, ids, strict=True):
            queue = queues.get(mid, self.queue) if mid is not None else self.queue
            parts.setdefault(queue, []).append(envelope)
        return list(parts.items())


_MACHINE_ID = re.compile(r'"machineId"\s*:\s*"([0-9A-Fa-f-]{36})"')


_STATUS = re.compile(r'"type"\s*:\s*"agent_status"')


def is_status(raw: str) -> bool:
    """Whether a raw message is an agent_status (a cheap look; the applier checks it all)."""
    if len(raw) > STATUS_BYTES or not _STATUS.search(raw):
        return False
    try:
        message = json.loads(raw)
    except (ValueError, RecursionError):
        return False
    return isinstance(message, dict) and message.get("type") == "agent_status"


def machine_id_in(raw: str) -> str | None:
    """The machine id a raw message names, for routing only (the first one, unchecked)."""
    found = _MACHINE_ID.search(raw[:4096])
    return found.group(1).lower() if found else None


class Routes:
    """Machine ids to their type's queue (FSM_QUEUES), read from the database for those not
    seen before (one query a batch), the most recent `most` kept."""

    def __init__(self, db: Engine, queue_for: Callable[[str], str], most: int = 100_000) -> None:
        self._db, self._queue_for, self._most = db, queue_for, most
        self._known: OrderedDict[str, str] = OrderedDict()

    def __call__(self, ids: set[str]) -> dict[str, str]:
        missing = [i for i in ids if i not in self._known]
        if missing:
            with self._db.connect() as conn:
                types = type_of_machines_txn(conn, missing)
            for mid, machine_type in types.items():
                self._known[mid] = self._queue_for(machine_type)
            while len(self._known) > self._most:
                self._known.popitem(last=False)
        return {i: self._known[i] for i in ids if i in self._known}


def wire(batch: list[Envelope], tries: int | None = None) -> Wire:
    """The messages as fsm.apply_acks takes them (JSON: the sender's id and the entry's as text;
    the task's `unwire` reads them back), each at its tries, or at `tries` if given (a relay
    is a copy's first)."""
    return [
        [
            d.item.raw,
            str(d.item.agent) if d.item.agent else None,
            d.source,
            d.item.stored_at,
            _text(d.key) if d.key is not None else None,
            d.tries if tries is None else tries,
        ]
        for d in batch
    ]


def _text(key: object) -> str:
    return key.decode() if isinstance(key, bytes) else str(key)


def chunks(batch: list[Envelope], max_bytes: int) -> list[list[Envelope]]:
    """The batch in consecutive parts of at most max_bytes of messages (a larger message alone)."""
    parts: list[list[Envelope]] = [[]]
    size = 0
    for envelope in batch:
        if parts[-1] and size + len(envelope.item.raw) > max_bytes:
            parts.append([])
            size = 0
        parts[-1].append(envelope)
        size += len(envelope.item.raw)
    return [part for part in parts if part]


def acks_repr(batch: list[Envelope]) -> str:
    """How Flower shows an apply_acks task: how many messages, and for which machines, states
    and attempts (the first ACKS_SHOWN; ids in full, so that a search by machine id finds it)."""
    shown = ", ".join(_message_repr(d.item.raw) for d in batch[:ACKS_SHOWN])
    more = f", and {len(batch) - ACKS_SHOWN} more" if len(batch) > ACKS_SHOWN else ""
    return f"{len(batch)} message{'s' if len(batch) != 1 else ''}: {shown}{more}"


def _message_repr(raw: str) -> str:
    try:
        message: Any = json.loads(raw)
    except (ValueError, RecursionError):
        return "(not JSON)"
    if not isinstance(message, dict):
        return "(not an object)"
    kind = str(message.get("type", "?"))[:20]
    if kind == "agent_status":
        return f"agent_status {str(message.get('agentId', '?'))[:40]}"
    machine = str(message.get("machineId", "?"))[:40]
    state = str(message.get("state", "?"))[:50]
    return f"{kind} {machine} state={state} attempt={str(message.get('attempt', '?'))[:12]}"
