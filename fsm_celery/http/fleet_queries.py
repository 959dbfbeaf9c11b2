"""The fleet-wide gauges' reads (fsm_celery.http.fleet): each one statement, by an index
or the folded statistics, and each bounded (at most MOST rows counted or read), so that a
scrape stays cheap whatever piles up: a count that reaches MOST says "MOST or more"."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, and_, exists, func, select

from fsm_celery.store.tables import (
    agent_type_slots,
    approval_gates,
    fan_outs,
    machine_events,
    machine_timers,
    machines,
)

MOST = 10_000  # rows a gauge counts at most
OVERDUE_GRACE = timedelta(seconds=30)  # a deadline passed by less is the scan's next second


def _counted_by(conn: Connection, key: Any, where: Any, *joined: Any) -> dict[str, int]:
    """Rows matching `where` (at most MOST of them), counted by `key`."""
    inner = select(key.label("key")).select_from(*joined).where(where).limit(MOST).subquery()
    rows = conn.execute(select(inner.c.key, func.count()).group_by(inner.c.key)).all()
    return {str(k): int(n) for k, n in rows}


def overdue_txn(conn: Connection, now: datetime) -> tuple[dict[str, int], datetime | None]:
    """Running machines whose deadline passed more than OVERDUE_GRACE ago, by type; and the
    earliest such deadline (by the scan's own index on machine_timers)."""
    t, m = machine_timers.c, machines.c
    overdue = and_(
        t.dispatch_due_at.is_(None),
        t.deadline_at < now - OVERDUE_GRACE,
        m.status == "running",
    )
    joined = machine_timers.join(machines, m.id == t.machine_id)
    counts = _counted_by(conn, m.type, overdue, joined)
    earliest = conn.execute(
        select(t.deadline_at).select_from(joined).where(overdue).order_by(t.deadline_at).limit(1)
    ).scalar()
    return counts, earliest


def fanouts_open_txn(conn: Connection) -> dict[str, int]:
    """Fan-outs waiting for their children, by their parent's type."""
    f, m = fan_outs.c, machines.c
    joined = fan_outs.join(machines, m.id == f.parent_id)
    return _counted_by(conn, m.type, f.closed_at.is_(None), joined)


def open_gates_txn(
    conn: Connection, now: datetime, fraction: float
) -> tuple[dict[str, int], dict[str, int]]:
    """The open approval gates (at most MOST), by their machine's type: how many, and how many
    have used `fraction` of their time (opened + (deadline - opened) * fraction <= now). On
    PostgreSQL counted in the statement, so a scrape reads a few rows whatever waits."""
    g, m = approval_gates.c, machines.c
    gates = (
        select(m.type.label("type"), g.opened_at, g.deadline_at)
        .select_from(approval_gates.join(machines, m.id == g.machine_id))
        .where(g.closed_at.is_(None), m.status.in_(("running", "paused")))
        .limit(MOST)
        .subquery()
    )
    waiting: dict[str, int] = {}
    late: dict[str, int] = {}
    if conn.dialect.name == "postgresql":
        opened, deadline = (
            func.extract("epoch", t) for t in (gates.c.opened_at, gates.c.deadline_at)
        )
        past = opened * (1 - fraction) + deadline * fraction <= now.timestamp()
        counted = select(gates.c.type, func.count(), func.count().filter(past))
        for machine_type, n, n_late in conn.execute(counted.group_by(gates.c.type)):
            waiting[str(machine_type)], late[str(machine_type)] = int(n), int(n_late)
        return waiting, late
    for machine_type, opened, deadline in conn.execute(select(gates)):
        opened, deadline = (t if t.tzinfo else t.replace(tzinfo=UTC) for t in (opened, deadline))
        key = str(machine_type)
        waiting[key] = waiting.get(key, 0) + 1
        late[key] = late.get(key, 0) + int(now >= opened + (deadline - opened) * fraction)
    return waiting, late


def events_kept_txn(conn: Connection) -> int:
    """Outside events kept for a state not entered yet."""
    e = machine_events.c
    inner = select(e.id).where(e.consumed_at.is_(None)).limit(MOST).subquery()
    return int(conn.execute(select(func.count()).select_from(inner)).scalar_one())


def work_waiting_txn(
    conn: Connection, agents_work: Callable[[str, int, str], bool]
) -> tuple[dict[str, int], dict[str, int]]:
    """By agent type: attempts dispatched and not answered (slots' in-flight count: a parent
    waiting for its children holds none), and machines queued for a slot. Only states an agent
    works count (`agents_work(type, version, state)`): a machine at an approval gate, waiting
    for an event or for a tool's call waits on no agent."""
    c = machines.c
    waiting_for_children = exists().where(
        and_(fan_outs.c.parent_id == c.id, fan_outs.c.closed_at.is_(None))
    )
    in_flight = and_(
        c.status == "running",
        c.dispatch_due_at.is_(None),
        c.queued_at.is_(None),
        c.deadline_at.is_not(None),
        ~waiting_for_children,
    )
    inner = (
        select(c.type, c.definition_version, c.current_state, c.agent_type)
        .where(in_flight)
        .limit(MOST)
        .subquery()
    )
    grouped = select(*inner.c, func.count()).group_by(*inner.c)
    dispatched: dict[str, int] = {}
    for row in conn.execute(grouped):
        machine_type, version, state, agent_type, n = tuple(row)
        if agents_work(str(machine_type), int(version), str(state)):
            dispatched[str(agent_type)] = dispatched.get(str(agent_type), 0) + int(n)
    queued = and_(c.status == "running", c.queued_at.is_not(None))
    return dispatched, _counted_by(conn, c.agent_type, queued, machines)


def slot_limits_txn(conn: Connection) -> dict[str, int]:
    """The bounded agent types' bounds (max_in_flight)."""
    s = agent_type_slots.c
    rows = conn.execute(select(s.agent_type, s.max_in_flight).where(s.max_in_flight.is_not(None)))
    return {str(t): int(n) for t, n in rows}
