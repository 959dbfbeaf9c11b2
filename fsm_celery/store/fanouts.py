"""The fan-outs' SQL: their counters (fan_outs), their children's slots (fan_out_items), and
the children themselves. Helpers take a connection and never commit; the caller holds the
parent's row lock (fsm_celery.engine.kinds.fanout), which serialises everything written here for
one fan-out."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, and_, bindparam, case, insert, select, update

from fsm_celery.core.join import Slot, SlotStatus, Tally, Verdict
from fsm_celery.core.usage import MAX_COST, MAX_TOKENS, Usage
from fsm_celery.store import dialects
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.rows import NewMachine
from fsm_celery.store.tables import fan_out_items, fan_outs, machines

AT_WORK = ("running", "paused")
# a fan-out's row without its shared input, read only where a child starts or hands back
_COUNTS = [column for column in fan_outs.c if column.name != "shared"]


def insert_machines_txn(conn: Connection, children: Sequence[NewMachine]) -> list[AnyRow]:
    """Insert the children and hand back their rows, as a lock of them would (in no set
    order)."""
    return dialects.of(conn).insert_rows(conn, machines, children, returning=True)


@dataclass(frozen=True)
class Opened:
    """A fan-out as it opens: its state, kind, children, counts and shared input (a map's)."""

    state: str
    kind: str
    total: int
    tally: Tally
    shared: Mapping[str, Any] | None


def open_txn(
    conn: Connection, parent_id: UUID, attempt: int, opened: Opened, now: datetime
) -> None:
    tally = opened.tally
    conn.execute(
        insert(fan_outs).values(
            parent_id=parent_id,
            attempt=attempt,
            state=opened.state,
            kind=opened.kind,
            total=opened.total,
            started=tally.started,
            succeeded=tally.succeeded,
            failed=tally.failed,
            verdict=tally.verdict.value,
            shared=dict(opened.shared) if opened.shared is not None else None,
            created_at=now,
        )
    )


def shared_txn(conn: Connection, parent_id: UUID, attempt: int) -> dict[str, Any]:
    """What every child of a map starts with besides its own slot's input (stored once)."""
    found = conn.execute(select(fan_outs.c.shared).where(_fan_out(parent_id, attempt))).scalar()
    return dict(found or {})


def insert_slots_txn(
    conn: Connection, parent_id: UUID, attempt: int, inputs: Sequence[Mapping[str, Any]]
) -> None:
    """A slot per child, each waiting with its starting context (a map's: its own part)."""
    waiting = SlotStatus.WAITING.value
    slots = [
        {"parent_id": parent_id, "attempt": attempt, "slot": n, "input": dict(i), "status": waiting}
        for n, i in enumerate(inputs)
    ]
    dialects.of(conn).insert_rows(conn, fan_out_items, slots)


def open_fan_out_txn(conn: Connection, parent_id: UUID) -> AnyRow | None:
    """The parent's fan-out its moving on has not closed (at most one)."""
    return conn.execute(
        select(*_COUNTS).where(fan_outs.c.parent_id == parent_id, fan_outs.c.closed_at.is_(None))
    ).first()


def fan_out_txn(conn: Connection, parent_id: UUID, attempt: int) -> AnyRow | None:
    return conn.execute(select(*_COUNTS).where(_fan_out(parent_id, attempt))).first()


def tally_of(row: AnyRow) -> Tally:
    return Tally(row.started, row.succeeded, row.failed, Verdict(row.verdict))


def count_txn(
    conn: Connection,
    parent_id: UUID,
    attempt: int,
    tally: Tally,
    decided_at: datetime | None = None,
    decided_by: UUID | None = None,
) -> None:
    """Write a fan-out's counts (and when and by whom its join was decided)."""
    changes: dict[str, Any] = {
        "started": tally.started,
        "succeeded": tally.succeeded,
        "failed": tally.failed,
        "verdict": tally.verdict.value,
    }
    if decided_at is not None:
        changes |= {"decided_at": decided_at, "decided_by": decided_by}
    conn.execute(update(fan_outs).where(_fan_out(parent_id, attempt)).values(**changes))


def close_txn(conn: Connection, parent_id: UUID, attempt: int, now: datetime) -> None:
    """The parent moved on: its fan-out counts nothing more (a pending one is marked closed)."""
    pending = fan_outs.c.verdict == Verdict.PENDING.value
    conn.execute(
        update(fan_outs)
        .where(_fan_out(parent_id, attempt))
        .values(
            closed_at=now,
            verdict=case((pending, Verdict.CLOSED.value), else_=fan_outs.c.verdict),
        )
    )


def _fan_out(parent_id: UUID, attempt: int) -> Any:
    return and_(fan_outs.c.parent_id == parent_id, fan_outs.c.attempt == attempt)


def end_slots_txn(conn: Connection, parent_id: UUID, attempt: int, ended: Sequence[Slot]) -> None:
    """Record how each child ended in its slot: its result, or its error."""
    dialects.of(conn).update_slots(
        conn,
        parent_id,
        attempt,
        [
            {
                "slot": slot.index,
                "status": slot.status.value,
                "result": dict(slot.result) if slot.result is not None else None,
                "error": slot.error,
            }
            for slot in ended
        ],
    )


def waiting_txn(
    conn: Connection, parent_id: UUID, attempt: int, first: int, most: int
) -> list[AnyRow]:
    """The slots from `first` on (`most` of them), waiting their turn: a map starts its items in
    order, so the next to start are those after the ones started (an index range, however far
    a 10,000-item map has got)."""
    c = fan_out_items.c
    return list(
        conn.execute(
            select(c.slot, c.input)
            .where(
                c.parent_id == parent_id,
                c.attempt == attempt,
                c.slot >= first,
                c.slot < first + most,
                c.status == SlotStatus.WAITING.value,
            )
            .order_by(c.slot)
        ).all()
    )


def start_slots_txn(
    conn: Connection, parent_id: UUID, attempt: int, started: Mapping[int, UUID]
) -> None:
    running = SlotStatus.RUNNING.value
    slots = [{"slot": s, "status": running, "child_id": c} for s, c in started.items()]
    dialects.of(conn).update_slots(conn, parent_id, attempt, slots)


def cancel_waiting_txn(conn: Connection, parent_id: UUID, attempt: int) -> int:
    """Mark the slots never started as cancelled; how many were."""
    c = fan_out_items.c
    result = conn.execute(
        update(fan_out_items)
        .where(c.parent_id == parent_id, c.attempt == attempt, c.status == SlotStatus.WAITING.value)
        .values(status=SlotStatus.CANCELLED.value)
    )
    return int(result.rowcount)


def inputs_txn(
    conn: Connection, parent_id: UUID, attempt: int, slots: Sequence[int]
) -> dict[int, Any]:
    """The starting context of each of those slots' children.

    Bounded by the slots' range as well: on a fan-out's fresh rows, before any statistics,
    PostgreSQL plans `slot IN (...)` as a filter over all the fan-out's slots (10,000 rows read
    for each batch of a 10,000-item map), and a range as part of the index scan; a batch's
    children end close together in slot order."""
    c = fan_out_items.c
    if not slots:
        return {}
    rows = conn.execute(
        select(c.slot, c.input).where(
            c.parent_id == parent_id,
            c.attempt == attempt,
            c.slot >= min(slots),
            c.slot <= max(slots),
            c.slot.in_(list(slots)),
        )
    ).all()
    return {row.slot: row.input for row in rows}


def slots_txn(conn: Connection, parent_id: UUID, attempt: int) -> list[Slot]:
    c = fan_out_items.c
    rows = conn.execute(
        select(c.slot, c.status, c.result, c.error)
        .where(c.parent_id == parent_id, c.attempt == attempt)
        .order_by(c.slot)
    ).all()
    return [Slot(r.slot, SlotStatus(r.status), r.result, r.error) for r in rows]


def children_txn(
    conn: Connection, parent_id: UUID, statuses: Sequence[str] = AT_WORK
) -> list[UUID]:
    """The parent's children in those statuses, of any of its attempts (read without a lock:
    the caller locks them, holding the parent, which keeps others off them)."""
    c = machines.c
    return list(
        conn.execute(
            select(c.id).where(c.parent_id == parent_id, c.status.in_(statuses)).order_by(c.id)
        ).scalars()
    )


def add_usage_txn(conn: Connection, spent: Mapping[UUID, Usage]) -> None:
    """Add descendants' spending to machines that did not move (a move writes its totals),
    saturating as Usage.rolled does."""
    if spent:
        conn.execute(
            update(machines)
            .where(machines.c.id == bindparam("_id"))
            .values(
                tokens_used=_saturated(machines.c.tokens_used, bindparam("t"), MAX_TOKENS),
                cost=_saturated(machines.c.cost, bindparam("c"), MAX_COST),
            ),
            [{"_id": mid, "t": u.tokens, "c": u.cost} for mid, u in spent.items()],
        )


def _saturated(total: Any, added: Any, most: float) -> Any:
    """total + added, no further than `most` (a total already past it stays as it is)."""
    return case((total >= most, total), (total + added > most, most), else_=total + added)
