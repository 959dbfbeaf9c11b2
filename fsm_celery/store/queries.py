"""The engine's SQL on machines, their history, definitions and budgets. Helpers take a
connection and never commit. The other tables have their own modules: agents.py, schedules.py,
notify.py (the notifications' outbox), github.py (deliveries), rollup.py (the statistics'
counters); reads.py holds the dashboard's lists.

What differs between PostgreSQL and SQLite lives in fsm_celery.store.postgres and .sqlite;
the rows written are typed in fsm_celery.store.rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Row,
    and_,
    delete,
    insert,
    select,
    update,
)

from fsm_celery.core.correction import REFUSED
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import parse_definition
from fsm_celery.store import dialects, partitions
from fsm_celery.store.rows import (
    Beat,
    Correction,
    Dispatch,
    History,
    Move,
    NewMachine,
    Rejection,
    values,
)
from fsm_celery.store.tables import (
    budget_changes,
    definitions,
    machine_timers,
    machines,
    rejected_messages,
    transitions,
)

AnyRow = Row[*tuple[Any, ...]]
PAYLOAD_KEEP = 4096  # characters of a rejected payload kept for the record


def save_definition_txn(conn: Connection, definition: MachineDefinition) -> tuple[int, bool]:
    """Store the definition as a new version unless the latest is identical: (version, created)."""
    digest = definition.digest()
    latest = conn.execute(
        select(definitions.c.version, definitions.c.digest)
        .where(definitions.c.type == definition.type)
        .order_by(definitions.c.version.desc())
        .limit(1)
    ).first()
    if latest is not None and latest.digest == digest:
        return latest.version, False
    version = 1 if latest is None else latest.version + 1
    body = definition.to_json()
    conn.execute(
        insert(definitions).values(
            type=definition.type,
            agent_type=definition.agent_type,
            description=definition.description,
            states=body["states"],
            initial_state=definition.initial_state,
            version=version,
            digest=digest,
            body=body,
        )
    )
    return version, True


def latest_definition_txn(
    conn: Connection, machine_type: str
) -> tuple[int, MachineDefinition] | None:
    """The newest version of a machine type, or None when none is loaded."""
    row = conn.execute(
        select(definitions.c.version, definitions.c.body)
        .where(definitions.c.type == machine_type)
        .order_by(definitions.c.version.desc())
        .limit(1)
    ).first()
    if row is None:
        return None
    return row.version, _stored(row.body, f"{machine_type} v{row.version}")


def definition_txn(conn: Connection, machine_type: str, version: int) -> MachineDefinition:
    """One stored version of a machine type."""
    body = conn.execute(
        select(definitions.c.body).where(
            definitions.c.type == machine_type, definitions.c.version == version
        )
    ).scalar_one()
    return _stored(body, f"{machine_type} v{version}")


def _stored(body: Any, source: str) -> MachineDefinition:
    """A stored version, as the static checker passed it when it was loaded: a check added
    since (a bound on timeouts, say) must not stop the machines already running on it."""
    return parse_definition(body, source, check=False)


def insert_machine_txn(conn: Connection, machine: NewMachine) -> None:
    conn.execute(insert(machines).values(**values(machine)))


def lock_machines_txn(
    conn: Connection, ids: Iterable[UUID], *, ancestors: bool = True, skip_locked: bool = False
) -> dict[UUID, AnyRow]:
    """Lock the machines' rows, with their ancestors' (a fan-out's parent, its parent...):
    ancestors first, then by id, so that concurrent transactions never deadlock. A child's end
    joins its parent in the same transaction, which therefore holds the parent already; and a
    transaction that holds a machine holds its whole subtree, as every other waits for the
    machine before it can lock any of its descendants (docs/fan-out.md). Without `ancestors`,
    the machines alone: for a transaction that moves no child (Entry.enter tries that first).
    With `skip_locked`, the rows others hold are left out (the scan's way: see with_ancestors)."""
    ordered = sorted(set(ids))
    if not ordered:
        return {}
    lock = dialects.of(conn).lock_machines
    return {row.id: row for row in lock(conn, ordered, ancestors, skip_locked)}


def with_ancestors(rows: dict[UUID, AnyRow], machine_id: UUID) -> bool:
    """Whether the machine and every ancestor of it are among the rows locked."""
    row = rows.get(machine_id)
    while row is not None and row.parent_id is not None:
        row = rows.get(row.parent_id)
    return row is not None


def get_machine_txn(conn: Connection, machine_id: UUID) -> AnyRow | None:
    return conn.execute(select(machines).where(machines.c.id == machine_id)).first()


def move_machines_txn(conn: Connection, moves: Sequence[Move], history: Sequence[History]) -> None:
    """Write the machines' decided states and the history rows of their attempts."""
    dialects.of(conn).move(conn, moves, history)


def update_heartbeats_txn(conn: Connection, beats: Sequence[Beat]) -> None:
    """Write each heartbeat's new deadline and progress."""
    dialects.of(conn).update(conn, machines, beats)


def count_corrections_txn(conn: Connection, corrections: Sequence[Correction]) -> None:
    """Write how many answers each machine's attempt has had refused."""
    dialects.of(conn).update(conn, machines, corrections)


def mark_dispatched_txn(conn: Connection, dispatches: Sequence[Dispatch]) -> None:
    """Record each dispatch: when its state was entered and its deadline."""
    dialects.of(conn).update(conn, machines, dispatches)


def _history_of(conn: Connection, machine_id: UUID) -> ColumnElement[bool]:
    """The machine's history rows. On PostgreSQL in its partition alone: its created_at (the
    partition key, store.tables) is looked up first and given as a value, so that the planner
    leaves the other months out (given as a subquery, it plans every month's scan, then skips
    them as the statement runs: ten times the work of the scan itself)."""
    if conn.dialect.name != "postgresql":
        return transitions.c.machine_id == machine_id
    created = conn.execute(
        select(machines.c.created_at).where(machines.c.id == machine_id)
    ).scalar_one_or_none()
    if created is None:
        return transitions.c.machine_id == machine_id  # no such machine: no rows
    return and_(transitions.c.machine_id == machine_id, transitions.c.machine_created_at == created)


def last_transition_txn(conn: Connection, machine_id: UUID) -> AnyRow | None:
    """The machine's latest history row."""
    return conn.execute(
        select(transitions)
        .where(_history_of(conn, machine_id))
        .order_by(transitions.c.attempt.desc(), transitions.c.id.desc())
        .limit(1)
    ).first()


def forks_txn(conn: Connection, machine_id: UUID, limit: int = 100) -> Sequence[AnyRow]:
    """The machines forked from this one, oldest first."""
    return conn.execute(
        select(machines)
        .where(machines.c.forked_from == machine_id)
        .order_by(machines.c.created_at)
        .limit(limit)
    ).all()


def type_of_machines_txn(conn: Connection, ids: Sequence[str]) -> dict[str, str]:
    """The type of each machine (ids as text; those that are no machine's left out)."""
    valid = []
    for value in ids:
        try:
            valid.append(UUID(value))
        except ValueError:
            continue
    rows = conn.execute(select(machines.c.id, machines.c.type).where(machines.c.id.in_(valid)))
    return {str(row.id): row.type for row in rows}


def ended_machines_txn(
    conn: Connection, machine_type: str, statuses: Sequence[str], limit: int
) -> Sequence[AnyRow]:
    """The newest machines of the type in those statuses, newest first."""
    m = machines.c
    return conn.execute(
        select(m.id, m.type, m.definition_version, m.status, m.created_at)
        .where(m.type == machine_type, m.status.in_(statuses))
        .order_by(m.created_at.desc(), m.id.desc())
        .limit(limit)
    ).all()


def histories_txn(conn: Connection, created: dict[UUID, datetime]) -> dict[UUID, list[AnyRow]]:
    """The history of each of the machines (id → its created_at), in attempt order; on
    PostgreSQL from the partitions of their creation months alone."""
    ids = list(created)
    found: dict[UUID, list[AnyRow]] = {mid: [] for mid in ids}
    t = transitions.c
    for chunk in (ids[i : i + 1000] for i in range(0, len(ids), 1000)):
        query = (
            select(transitions)
            .where(t.machine_id.in_(chunk))
            .order_by(t.machine_id, t.attempt, t.id)
        )
        if conn.dialect.name == "postgresql":
            query = query.where(t.machine_created_at.in_({created[mid] for mid in chunk}))
        for row in conn.execute(query):
            found[row.machine_id].append(row)
    return found


def context_deltas_txn(conn: Connection, machine_id: UUID, upto: int) -> Sequence[AnyRow]:
    """The machine's history rows up to attempt `upto`, in order: each one's attempt, states
    and context change only (the context at that step is their fold)."""
    t = transitions.c
    return conn.execute(
        select(t.attempt, t.event, t.from_state, t.to_state, t.context_delta)
        .where(_history_of(conn, machine_id), t.attempt <= upto, t.event != REFUSED)
        .order_by(t.attempt)
    ).all()


def insert_transitions_txn(conn: Connection, history: Sequence[History]) -> None:
    """Record the start rows of new machines (in their creation month's partition, made if
    beat has not yet: the rows that follow go to the same one)."""
    if history:
        if conn.dialect.name == "postgresql":
            partitions.ready(conn, partitions.HISTORY, (h.machine_created_at for h in history))
        dialects.of(conn).insert_rows(conn, transitions, history)


def insert_rejections_txn(conn: Connection, rejections: Sequence[Rejection]) -> None:
    """Record rejected messages (PostgreSQL text cannot hold NUL: it is kept visible, escaped;
    a payload is cut to what is worth keeping)."""
    if rejections:
        if conn.dialect.name == "postgresql":
            partitions.ready(conn, partitions.REJECTED, (r.received_at for r in rejections))
        rows = [
            values(r)
            | {
                "payload": r.payload[:PAYLOAD_KEEP].replace("\x00", "\\u0000"),
                "detail": r.detail.replace("\x00", "\\u0000"),
            }
            for r in rejections
        ]
        conn.execute(insert(rejected_messages), rows)


def history_txn(conn: Connection, machine_id: UUID) -> Sequence[AnyRow]:
    return conn.execute(
        select(transitions)
        .where(_history_of(conn, machine_id))
        .order_by(transitions.c.attempt, transitions.c.id)
    ).all()


def rejections_txn(
    conn: Connection, machine_id: UUID | None = None, limit: int = 100
) -> Sequence[AnyRow]:
    query = select(rejected_messages).order_by(rejected_messages.c.id.desc()).limit(limit)
    if machine_id is not None:
        query = query.where(rejected_messages.c.machine_id == machine_id)
    return conn.execute(query).all()


def scan_candidates_txn(
    conn: Connection, overdue: datetime, due: datetime, limit: int, only: UUID | None = None
) -> tuple[list[UUID], list[UUID]]:
    """The machines past their deadline, and those due to be dispatched, by their timers (no
    lock taken: the scan locks them with their ancestors, then checks the machine rows again
    with `overdue` and `due`); only: that machine, if it is one."""
    t = machine_timers.c
    found: list[list[UUID]] = []
    past_deadline = and_(t.dispatch_due_at.is_(None), t.deadline_at <= overdue)
    for where, order in (
        (past_deadline, t.deadline_at),
        (t.dispatch_due_at <= due, t.dispatch_due_at),
    ):
        query = select(t.machine_id).where(where).order_by(order).limit(limit)
        if only is not None:
            query = query.where(t.machine_id == only)
        found.append([row.machine_id for row in conn.execute(query)])
    return found[0], found[1]


def overdue(row: AnyRow, now: datetime) -> bool:
    """Whether a locked machine's attempt is past its deadline (as its timer says)."""
    return (
        row.status == "running"
        and row.dispatch_due_at is None
        and row.deadline_at is not None
        and _utc(row.deadline_at) <= now
    )


def due(row: AnyRow, now: datetime) -> bool:
    """Whether a locked machine's next state is due to be dispatched (as its timer says)."""
    return (
        row.status == "running"
        and row.dispatch_due_at is not None
        and _utc(row.dispatch_due_at) <= now
    )


def _utc(value: datetime) -> datetime:
    return value if value.tzinfo is not None else value.replace(tzinfo=UTC)


def prune_rejections_txn(conn: Connection, before: datetime, limit: int) -> int:
    """Delete up to limit rejected messages received before `before`; how many were."""
    oldest = (
        select(rejected_messages.c.id)
        .where(rejected_messages.c.received_at < before)
        .order_by(rejected_messages.c.received_at)
        .limit(limit)
    )
    doomed = [row.id for row in conn.execute(oldest)]
    if doomed:
        conn.execute(delete(rejected_messages).where(rejected_messages.c.id.in_(doomed)))
    return len(doomed)


def set_budget_txn(
    conn: Connection, machine_id: UUID, tokens: int | None, cost: float | None
) -> None:
    conn.execute(
        update(machines)
        .where(machines.c.id == machine_id)
        .values(budget_tokens=tokens, budget_cost=cost)
    )


def record_budget_change_txn(conn: Connection, machine_id: UUID, **fields: object) -> None:
    """Audit a budget change: actor, reason, the new and the previous limits."""
    conn.execute(insert(budget_changes).values(machine_id=machine_id, **fields))


def budget_changes_txn(conn: Connection, machine_id: UUID) -> Sequence[AnyRow]:
    """The machine's budget changes, oldest first."""
    return oldest_first_txn(conn, budget_changes.c.machine_id, machine_id)


def oldest_first_txn(conn: Connection, key: Column[Any], value: object) -> Sequence[AnyRow]:
    """The rows of the key's table whose key holds the value, in the order they were written
    (by their `id`): an audit's or a log's entries of one machine, agent or gate."""
    table = key.table
    return conn.execute(select(table).where(key == value).order_by(table.c.id)).all()
