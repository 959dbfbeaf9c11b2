"""The approval gate state kind: a machine entering an approval state opens a gate (its
deadline set, its people asked); a machine resumed there keeps it; its deadline (the scan) or
its people's verdict (fsm_celery.engine.approvals) closes it, and a machine taken away from it
leaves it closed as `left` (by engine/entry.py, once the transaction's moves are written: its
Opened part says which machines opened a gate in it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core import gate, notify
from fsm_celery.core.clock import aware
from fsm_celery.core.definition import StateDefinition
from fsm_celery.engine.kinds.base import Entering
from fsm_celery.engine.runtime import Runtime
from fsm_celery.store import gates as store
from fsm_celery.store import queries as q
from fsm_celery.store.notify import insert_notifications_txn
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.writes import Writes


@dataclass
class Opened:
    """A transaction's part (Writes.parts): the machines that opened an approval gate in it."""

    machines: set[UUID] = field(default_factory=set)

    def write(self, conn: Connection, writes: Writes) -> None:
        """Nothing of its own: the gates are written as they open."""


class ApprovalGate:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def enter_txn(self, at: Entering) -> None:
        """Enter an approval state: open its gate (or, for a machine resumed there, keep the one it
        had, with the decisions made), set the machine's deadline to the gate's, and ask its people
        (a notification, where the definition or FSM_NOTIFY_URL asks for them)."""
        conn, _, row, _, state, writes, _ = at
        assert state.approval is not None
        attempt = writes.machine(row).attempt
        opened = store.open_gate_txn(conn, row.id)
        if opened is not None and opened.state == state.name and _resumed(conn, row.id, writes):
            store.update_txn(conn, opened.id, attempt=attempt)
            writes.entering(row.id, aware(opened.deadline_at) or writes.now, row.agent_id)
            return
        if opened is not None:  # left another way (forced, retried, rewound): closed now
            store.update_txn(conn, opened.id, verdict="left", closed_at=writes.now)
        deadline = writes.now + state.timeout
        members = gate.members_of(self._rt.settings.approver_groups, state.approval)
        needed = gate.needed(state.approval, len(members))
        store.open_txn(conn, row.id, state.name, attempt, writes.now, deadline, needed)
        _opened(writes).machines.add(row.id)
        writes.entering(row.id, deadline, row.agent_id)
        _ask(conn, self._rt, row, state, attempt, deadline, writes.now)


def _resumed(conn: Connection, machine_id: UUID, writes: Writes) -> bool:
    """Whether the machine enters its state because it was resumed there: its latest
    transition, in this transaction or recorded before it."""
    events = [event for moved, _, event in writes.log if moved.id == machine_id]
    if events:
        return events[-1] == "resume"
    last = q.last_transition_txn(conn, machine_id)
    return last is not None and last.event == "resume"


def close_txn(conn: Connection, machine_id: UUID, verdict: str, now: datetime) -> None:
    """Close the machine's open gate (its deadline decided it, say)."""
    opened = store.open_gate_txn(conn, machine_id)
    if opened is not None:
        store.update_txn(conn, opened.id, verdict=verdict, closed_at=now)


def _ask(
    conn: Connection,
    runtime: Runtime,
    row: AnyRow,
    state: StateDefinition,
    attempt: int,
    deadline: datetime,
    now: datetime,
) -> None:
    """Queue the notification that people are waited for, with the page to decide on."""
    definition = runtime.catalog.version(conn, row.type, row.definition_version)
    urls = notify.targets(definition.notify, runtime.settings.notify_url, notify.APPROVAL)
    if not urls:
        return
    assert state.approval is not None
    base = runtime.settings.dashboard_url.rstrip("/")
    payload = notify.approval_payload(
        machine_id=row.id,
        machine_type=row.type,
        state=state.name,
        attempt=attempt,
        approvers=list(state.approval.approvers),
        deadline=deadline,
        github_issue=row.github_issue,
        decide_url=f"{base}/machines/{row.id}#decide" if base else None,
        at=now,
    )
    insert_notifications_txn(
        conn,
        [
            {
                "machine_id": row.id,
                "url": url,
                "event": notify.APPROVAL,
                "payload": payload,
                "next_attempt_at": now,
            }
            for url in urls
        ],
    )


def _opened(writes: Writes) -> Opened:
    """The transaction's Opened (made now, the first time): its part of Writes.parts."""
    found = writes.parts.get(Opened)
    if found is None:
        found = writes.parts[Opened] = Opened()
    return found
