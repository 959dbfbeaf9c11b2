"""Approval gates' rows: a gate per visit of a machine to an approval state, and the decisions
made at it. Each helper takes the connection and never commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, insert, select, update

from fsm_celery.store import dialects, fanouts
from fsm_celery.store.queries import AnyRow, oldest_first_txn
from fsm_celery.store.tables import approval_decisions, approval_gates, machines


def open_gate_txn(conn: Connection, machine_id: UUID) -> AnyRow | None:
    """The machine's open gate, locked (its machine's row is locked first, by the caller)."""
    return conn.execute(
        select(approval_gates)
        .where(approval_gates.c.machine_id == machine_id, approval_gates.c.closed_at.is_(None))
        .with_for_update()
    ).first()


def open_txn(
    conn: Connection,
    machine_id: UUID,
    state: str,
    attempt: int,
    now: datetime,
    deadline: datetime,
    needed: int,
) -> int:
    """Open a gate; its id."""
    gate_id: int = conn.execute(
        insert(approval_gates)
        .values(
            machine_id=machine_id,
            state=state,
            attempt=attempt,
            opened_at=now,
            deadline_at=deadline,
            needed=needed,
        )
        .returning(approval_gates.c.id)
    ).scalar_one()
    return gate_id


def update_txn(conn: Connection, gate_id: int, **values: Any) -> None:
    conn.execute(update(approval_gates).where(approval_gates.c.id == gate_id).values(**values))


def leave_txn(conn: Connection, machine_ids: Sequence[UUID], now: datetime) -> None:
    """Close, as `left`, the open gates of these machines that no longer wait at them (ended,
    or moved to another state; one paused there keeps its gate, and a new visit to the same
    state closes the old one as it opens its own): read after the machines' rows were written."""
    waiting = (
        select(machines.c.id)
        .where(
            machines.c.id == approval_gates.c.machine_id,
            machines.c.current_state == approval_gates.c.state,
            machines.c.status.in_(fanouts.AT_WORK),
        )
        .exists()
    )
    conn.execute(
        update(approval_gates)
        .where(
            approval_gates.c.machine_id.in_(machine_ids),
            approval_gates.c.closed_at.is_(None),
            ~waiting,
        )
        .values(verdict="left", closed_at=now)
    )


def record_txn(conn: Connection, gate_id: int, machine_id: UUID, **decision: Any) -> bool:
    """Record a person's decision; False when they decided at this gate already."""
    statement = (
        dialects.of(conn)
        .insert(approval_decisions)
        .values(gate_id=gate_id, machine_id=machine_id, **decision)
        .on_conflict_do_nothing(index_elements=["gate_id", "actor"])
    )
    return conn.execute(statement).rowcount == 1


def decisions_txn(conn: Connection, gate_id: int) -> Sequence[AnyRow]:
    """The gate's decisions, oldest first."""
    return oldest_first_txn(conn, approval_decisions.c.gate_id, gate_id)


def machine_decisions_txn(conn: Connection, machine_id: UUID) -> Sequence[AnyRow]:
    """Every decision made at the machine's gates, oldest first, with its gate's state."""
    return conn.execute(
        select(approval_decisions, approval_gates.c.state, approval_gates.c.attempt)
        .join(approval_gates, approval_gates.c.id == approval_decisions.c.gate_id)
        .where(approval_decisions.c.machine_id == machine_id)
        .order_by(approval_decisions.c.id)
    ).all()


def machine_gates_txn(conn: Connection, machine_id: UUID) -> Sequence[AnyRow]:
    """The machine's gates, oldest first."""
    return oldest_first_txn(conn, approval_gates.c.machine_id, machine_id)


def pending_txn(conn: Connection, limit: int, machine_type: str | None = None) -> Sequence[AnyRow]:
    """The gates waiting for people, soonest deadline first: open, and their machine still in
    the gate's state and attempt (running, or paused there)."""
    query = (
        select(
            approval_gates,
            machines.c.type,
            machines.c.status,
            machines.c.github_issue,
            machines.c.parent_id,
        )
        .join(machines, machines.c.id == approval_gates.c.machine_id)
        .where(
            approval_gates.c.closed_at.is_(None),
            machines.c.attempt == approval_gates.c.attempt,
            machines.c.current_state == approval_gates.c.state,
            machines.c.status.in_(fanouts.AT_WORK),
        )
        .order_by(approval_gates.c.deadline_at, approval_gates.c.id)
        .limit(limit)
    )
    if machine_type is not None:
        query = query.where(machines.c.type == machine_type)
    return conn.execute(query).all()
