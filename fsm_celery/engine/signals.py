"""Outside events: sent to a machine waiting for one, applied in the transaction that records
it, with the machine's row locked; sent before the machine waits, kept (a few per machine and
name) and applied when it enters the state that waits, in that transaction
(engine/kinds/wait.py). A key the sender gives makes an event sent twice one event. The
decision is fsm_celery.core.transition's.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core import signal
from fsm_celery.core.messages import json_problem, unstorable
from fsm_celery.core.steps import Next
from fsm_celery.core.transition import (
    MachineStatus,
)
from fsm_celery.engine.kinds import wait as wait_kind
from fsm_celery.engine.usecase import MovingUseCase
from fsm_celery.exceptions import EventRefused, InvalidEvent, MachineNotFound
from fsm_celery.store import fanouts
from fsm_celery.store import queries as q
from fsm_celery.store import signals as store
from fsm_celery.store.writes import Writes


@dataclass(frozen=True)
class Signalled:
    """What an event did: applied (the machine moved), kept (for the state that waits for it),
    or duplicate (its key was sent before: nothing)."""

    machine_id: UUID
    name: str
    outcome: str
    state: str  # where the machine is now
    moved_to: str | None = None
    next: Next = field(default_factory=list)


class Signals(MovingUseCase):
    def send(
        self,
        machine_id: UUID,
        name: str,
        payload: Mapping[str, Any],
        sender: str,
        via: str = "api",
        key: str | None = None,
    ) -> Signalled:
        """Send the machine an outside event (see the module's docstring)."""
        writes = Writes(self._rt.clock())
        observer = self._rt.observer
        try:
            with self._rt.transaction(writes) as conn:
                done = self.send_txn(conn, writes, machine_id, name, payload, sender, via, key)
        except (EventRefused, InvalidEvent):
            if observer is not None:
                observer.event("refused")
            raise
        if observer is not None:
            observer.event(done.outcome)
        return replace(done, next=writes.next())

    def send_txn(
        self,
        conn: Connection,
        writes: Writes,
        machine_id: UUID,
        name: str,
        payload: Mapping[str, Any],
        sender: str,
        via: str = "api",
        key: str | None = None,
    ) -> Signalled:
        """send, in the caller's transaction (a GitHub delivery is recorded in the same); it
        writes everything the transaction did, so the caller writes nothing after it."""
        _check(machine_id, name, payload, sender, key, self._rt.settings.max_payload_bytes)
        rows = q.lock_machines_txn(conn, [machine_id], ancestors=True)
        row = rows.get(machine_id)
        if row is None:
            raise MachineNotFound(str(machine_id))
        definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        waiting = signal.waiting_for(definition.states, name)
        if not waiting:
            known = ", ".join(signal.events_of(definition.states)) or "none"
            raise InvalidEvent(
                str(machine_id), f"a {row.type} machine waits for no {name!r} event ({known})"
            )
        if key is not None and store.key_recorded_txn(conn, machine_id, key):
            return Signalled(machine_id, name, "duplicate", row.current_state)  # ended or not
        if row.status not in fanouts.AT_WORK:
            raise EventRefused(str(machine_id), f"the machine is {row.status}: it waits no more")
        state = definition.state(row.current_state)
        here = state in waiting and row.status == MachineStatus.RUNNING.value
        wait = (state if here else waiting[0]).wait
        assert wait is not None
        problem = signal.payload_problem(wait, payload)
        if problem is not None:
            raise InvalidEvent(str(machine_id), f"{name}: {problem}")
        if not here:
            self._room_txn(conn, machine_id, name)
        event_id = store.record_txn(
            conn,
            machine_id=machine_id,
            name=name,
            payload=dict(payload),
            sender=sender,
            via=via,
            key=key,
            received_at=writes.now,
        )
        if event_id is None:  # its key was sent before
            return Signalled(machine_id, name, "duplicate", row.current_state)
        if not here:
            return Signalled(machine_id, name, "kept", row.current_state)
        moved = wait_kind.apply_txn(
            conn, definition, state, row, event_id, name, payload, sender, writes, self._rt.limits
        )
        if moved is None:
            raise InvalidEvent(str(machine_id), f"{name}: {writes.rejections[-1].detail}")
        self._entry.enter_due_txn(conn, rows, writes)
        self._entry.send_and_write(conn, writes)
        return Signalled(machine_id, name, "applied", moved, moved)

    def _room_txn(self, conn: Connection, machine_id: UUID, name: str) -> None:
        """Refuse an event past the FSM_MAX_KEPT_EVENTS of its name kept for the machine."""
        kept = store.kept_count_txn(conn, machine_id, name)
        if kept >= self._rt.settings.max_kept_events:
            raise EventRefused(
                str(machine_id),
                f"{kept} {name} events are kept for it already (FSM_MAX_KEPT_EVENTS)",
            )


def _check(
    machine_id: UUID,
    name: str,
    payload: Mapping[str, Any],
    sender: str,
    key: str | None,
    max_bytes: int,
) -> None:
    """Refuse an event too large, badly named, or holding what cannot be stored, before any
    lock is taken."""
    where = str(machine_id)
    if not 0 < len(name) <= 50:
        raise InvalidEvent(where, "an event's name is 1 to 50 characters")
    if not isinstance(payload, Mapping):
        raise InvalidEvent(where, "the payload must be a JSON object")
    if not sender or len(sender) > signal.SENDER_CHARS:
        raise InvalidEvent(where, f"the sender must be 1 to {signal.SENDER_CHARS} characters")
    if key is not None and not 0 < len(key) <= signal.KEY_CHARS:
        raise InvalidEvent(where, f"the key must be 1 to {signal.KEY_CHARS} characters")
    problem = unstorable({"name": name, "sender": sender, "key": key or ""}, "event")
    most = min(signal.MAX_PAYLOAD_BYTES, max_bytes)
    problem = problem or json_problem(dict(payload), "the payload", most)
    if problem is not None:
        raise InvalidEvent(where, problem)
