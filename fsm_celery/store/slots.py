"""Per agent type, the bound on work in flight and the machines queued for it
(agent_type_slots, state_machines.queued_at). Helpers take a connection and never commit."""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection, and_, exists, func, literal, select, tuple_, update

from fsm_celery.store import dialects
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.tables import agent_type_slots, fan_outs, machines

BOUND_SECONDS = 2.0  # how long a process keeps an agent type's bound before reading it again


class Bounds:
    """Per agent type, its bound on work in flight as this process knows it: the settings'
    (FSM_AGENT_TYPE_LIMITS), else the newest load's, read again once BOUND_SECONDS passed (a
    load that changes it takes hold within them), not in every transaction."""

    def __init__(self, limits: Mapping[str, int]) -> None:
        self._limits = limits
        self._known: dict[str, tuple[int | None, float]] = {}  # bound, and until when kept

    def of(self, conn: Connection, agent_type: str) -> int | None:
        """The type's bound (None: unbounded)."""
        now = time.monotonic()
        known = self._known.get(agent_type)
        if known is not None and known[1] > now:
            return known[0]
        if agent_type in self._limits:
            ensure_txn(conn, agent_type)  # a row to count in
            bound: int | None = self._limits[agent_type]
        else:
            bound = limited_txn(conn, [agent_type]).get(agent_type)
        self._known[agent_type] = (bound, now + BOUND_SECONDS)
        return bound


def set_limits_txn(conn: Connection, limits: Mapping[str, int | None]) -> None:
    """Make these the agent types' bounds (None: no bound), keeping their counts."""
    if not limits:
        return
    statement = dialects.of(conn).insert(agent_type_slots)
    statement = statement.on_conflict_do_update(
        index_elements=[agent_type_slots.c.agent_type],
        set_={"max_in_flight": statement.excluded.max_in_flight},
    )
    conn.execute(
        statement,
        [{"agent_type": t, "max_in_flight": m, "in_flight": 0} for t, m in limits.items()],
    )


def ensure_txn(conn: Connection, agent_type: str) -> None:
    """Give a type bounded by the settings its row, to count in."""
    statement = dialects.of(conn).insert(agent_type_slots).values(agent_type=agent_type)
    conn.execute(statement.on_conflict_do_nothing(index_elements=[agent_type_slots.c.agent_type]))


def bounded_txn(conn: Connection) -> list[str]:
    """The agent types a definition bounds."""
    c = agent_type_slots.c
    return list(conn.execute(select(c.agent_type).where(c.max_in_flight.is_not(None))).scalars())


def make_due_txn(conn: Connection, ids: Sequence[UUID], now: datetime) -> None:
    """Take queued machines out of the queue, due to be entered by the scan."""
    if ids:
        conn.execute(
            update(machines)
            .where(machines.c.id.in_(list(ids)))
            .values(queued_at=None, dispatch_due_at=now)
        )


def limited_txn(conn: Connection, agent_types: Sequence[str]) -> dict[str, int]:
    """The bounds of those of the types that have one (read without a lock)."""
    c = agent_type_slots.c
    rows = conn.execute(
        select(c.agent_type, c.max_in_flight).where(
            c.agent_type.in_(list(agent_types)), c.max_in_flight.is_not(None)
        )
    ).all()
    return {row.agent_type: row.max_in_flight for row in rows}


def lock_txn(conn: Connection, agent_type: str) -> int:
    """Lock the type's row (until the transaction ends) and read its count in flight."""
    c = agent_type_slots.c
    statement = select(c.in_flight).where(c.agent_type == agent_type).with_for_update()
    found = conn.execute(statement).scalar()
    return int(found or 0)


def write_counts_txn(conn: Connection, counts: Mapping[str, int]) -> None:
    for agent_type, count in counts.items():
        conn.execute(
            update(agent_type_slots)
            .where(agent_type_slots.c.agent_type == agent_type)
            .values(in_flight=max(count, 0))
        )


def queued_txn(conn: Connection, agent_type: str, most: int) -> list[AnyRow]:
    """Lock the type's machines longest queued, first come first served (rows another
    transaction holds are skipped: it is moving them)."""
    if most <= 0:
        return []
    c = machines.c
    return list(
        conn.execute(
            select(machines)
            .where(c.agent_type == agent_type, c.queued_at.is_not(None), c.status == "running")
            .order_by(c.queued_at, func.coalesce(c.slot, -1), c.id)
            .limit(most)
            .with_for_update(skip_locked=True)
        ).all()
    )


def in_flight_txn(conn: Connection, agent_type: str) -> int:
    """Count the type's attempts in flight: dispatched, awaiting an ack (a parent waiting for
    its children's join holds no slot)."""
    c = machines.c
    waiting_for_children = exists().where(
        and_(fan_outs.c.parent_id == c.id, fan_outs.c.closed_at.is_(None))
    )
    statement = select(func.count()).where(
        c.agent_type == agent_type,
        c.status == "running",
        c.dispatch_due_at.is_(None),
        c.queued_at.is_(None),
        c.deadline_at.is_not(None),
        ~waiting_for_children,
    )
    return int(conn.execute(statement).scalar_one())


def queue_position_txn(conn: Connection, row: AnyRow) -> int:
    """A queued machine's place in its agent type's queue (1: the next to be entered), in the
    order queued_txn takes them."""
    c = machines.c
    key = tuple_(c.queued_at, func.coalesce(c.slot, -1), c.id)
    mine = tuple_(
        literal(row.queued_at), literal(-1 if row.slot is None else row.slot), literal(row.id)
    )
    statement = select(func.count()).where(
        c.agent_type == row.agent_type,
        c.queued_at.is_not(None),
        c.status == "running",
        key < mine,
    )
    return int(conn.execute(statement).scalar_one()) + 1
