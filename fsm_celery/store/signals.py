"""Outside events' rows: those kept for machines not yet waiting for them, and those applied.
Each helper takes the connection and never commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, func, select, update

from fsm_celery.store import dialects
from fsm_celery.store.queries import AnyRow, oldest_first_txn
from fsm_celery.store.tables import machine_events


def record_txn(conn: Connection, **event: Any) -> int | None:
    """Record an event; its id, or None when its key was recorded for the machine before."""
    statement = (
        dialects.of(conn)
        .insert(machine_events)
        .values(**event)
        .on_conflict_do_nothing(index_elements=["machine_id", "key"])
        .returning(machine_events.c.id)
    )
    found: int | None = conn.execute(statement).scalar()
    return found


def key_recorded_txn(conn: Connection, machine_id: UUID, key: str) -> bool:
    """Whether an event with the key was recorded for the machine."""
    found = conn.execute(
        select(machine_events.c.id)
        .where(machine_events.c.machine_id == machine_id, machine_events.c.key == key)
        .limit(1)
    ).first()
    return found is not None


def kept_count_txn(conn: Connection, machine_id: UUID, name: str) -> int:
    return int(
        conn.execute(
            select(func.count())
            .select_from(machine_events)
            .where(
                machine_events.c.machine_id == machine_id,
                machine_events.c.name == name,
                machine_events.c.consumed_at.is_(None),
            )
        ).scalar_one()
    )


def oldest_kept_txn(conn: Connection, machine_id: UUID, name: str) -> AnyRow | None:
    """The machine's oldest event of the name kept for it, locked."""
    return conn.execute(
        select(machine_events)
        .where(
            machine_events.c.machine_id == machine_id,
            machine_events.c.name == name,
            machine_events.c.consumed_at.is_(None),
        )
        .order_by(machine_events.c.id)
        .limit(1)
        .with_for_update()
    ).first()


def consume_txn(conn: Connection, event_id: int, attempt: int, now: datetime, outcome: str) -> None:
    conn.execute(
        update(machine_events)
        .where(machine_events.c.id == event_id)
        .values(consumed_at=now, attempt=attempt, outcome=outcome)
    )


def machine_events_txn(conn: Connection, machine_id: UUID) -> Sequence[AnyRow]:
    """The machine's events, oldest first."""
    return oldest_first_txn(conn, machine_events.c.machine_id, machine_id)
