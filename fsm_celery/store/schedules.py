"""Schedules' rows (a definition's cron schedules, the ticks they ran, operators' changes) and
when each periodic job last ran. Each helper takes the connection and never commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import ColumnElement, Connection, Table, func, insert, select, true, update

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.schedule import Schedule, next_tick
from fsm_celery.store import dialects
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.tables import liveness, machines, schedule_events, schedule_runs, schedules

LOADER = "definitions load"  # the actor of the schedule changes a load makes


def sync_schedules_txn(conn: Connection, definition: MachineDefinition, now: datetime) -> None:
    """Make the stored schedules of the definition's type its own: new ones added, changed
    ones updated, those it no longer has retired (kept for their history). Whether a
    schedule is paused is the operators' and survives a load."""
    stored = schedules_of_txn(conn, definition.type)
    for schedule in definition.schedules:
        row = stored.get(schedule.name)
        fields = _schedule_fields(schedule)
        if row is None:
            sid = insert_schedule_txn(
                conn,
                machine_type=definition.type,
                name=schedule.name,
                next_run_at=next_tick(schedule.cron, schedule.timezone, now),
                created_at=now,
                updated_at=now,
                **fields,
            )
            schedule_event_txn(conn, sid, "created", LOADER, detail=fields)
            continue
        changed = {k: v for k, v in fields.items() if getattr(row, k) != v}
        if not changed and row.removed_at is None:
            continue
        changes: dict[str, Any] = {**changed, "removed_at": None, "updated_at": now}
        if "cron" in changed or "timezone" in changed or row.removed_at is not None:
            changes["next_run_at"] = next_tick(schedule.cron, schedule.timezone, now)
        update_schedule_txn(conn, row.id, **changes)
        schedule_event_txn(conn, row.id, "updated", LOADER, detail=fields)
    kept = {s.name for s in definition.schedules}
    for name, row in stored.items():
        if name not in kept and row.removed_at is None:
            update_schedule_txn(conn, row.id, removed_at=now, updated_at=now)
            schedule_event_txn(conn, row.id, "removed", LOADER)


def _schedule_fields(schedule: Schedule) -> dict[str, Any]:
    return {
        "cron": schedule.cron,
        "timezone": schedule.timezone,
        "context": schedule.context,
        "overlap": schedule.overlap.value,
    }


def schedules_of_txn(conn: Connection, machine_type: str) -> dict[str, AnyRow]:
    """The machine type's schedules by name, locked (a load and beat do not interleave)."""
    rows = conn.execute(
        select(schedules).where(schedules.c.machine_type == machine_type).with_for_update()
    ).all()
    return {row.name: row for row in rows}


def insert_schedule_txn(conn: Connection, **fields: Any) -> int:
    schedule_id: int = conn.execute(
        insert(schedules).values(**fields).returning(schedules.c.id)
    ).scalar_one()
    return schedule_id


def update_schedule_txn(conn: Connection, schedule_id: int, **fields: Any) -> None:
    conn.execute(update(schedules).where(schedules.c.id == schedule_id).values(**fields))


def lock_due_schedules_txn(conn: Connection, now: datetime, limit: int) -> Sequence[AnyRow]:
    """Active schedules whose next tick is past, locked; those another beat holds are skipped."""
    return conn.execute(
        select(schedules)
        .where(
            schedules.c.next_run_at <= now,
            schedules.c.paused.is_(False),
            schedules.c.removed_at.is_(None),
        )
        .order_by(schedules.c.next_run_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


def lock_schedule_txn(conn: Connection, machine_type: str, name: str) -> AnyRow | None:
    return conn.execute(
        select(schedules)
        .where(schedules.c.machine_type == machine_type, schedules.c.name == name)
        .with_for_update()
    ).first()


def claim_tick_txn(conn: Connection, schedule_id: int, tick: datetime, outcome: str) -> bool:
    """Record the schedule's tick; False when it was recorded already (by another beat)."""
    statement = (
        dialects.of(conn)
        .insert(schedule_runs)
        .values(schedule_id=schedule_id, tick_at=tick, outcome=outcome)
        .on_conflict_do_nothing()
    )
    return conn.execute(statement).rowcount == 1


def record_tick_txn(
    conn: Connection,
    schedule_id: int,
    tick: datetime,
    outcome: str,
    machine_id: UUID | None = None,
    detail: str | None = None,
    actor: str | None = None,
) -> None:
    conn.execute(
        update(schedule_runs)
        .where(schedule_runs.c.schedule_id == schedule_id, schedule_runs.c.tick_at == tick)
        .values(outcome=outcome, machine_id=machine_id, detail=detail, actor=actor)
    )


def schedule_event_txn(
    conn: Connection,
    schedule_id: int,
    action: str,
    actor: str,
    reason: str = "",
    detail: dict[str, Any] | None = None,
) -> None:
    conn.execute(
        insert(schedule_events).values(
            schedule_id=schedule_id, action=action, actor=actor, reason=reason, detail=detail
        )
    )


def machine_status_txn(conn: Connection, machine_id: UUID) -> str | None:
    status: str | None = conn.execute(
        select(machines.c.status).where(machines.c.id == machine_id)
    ).scalar()
    return status


def list_schedules_txn(conn: Connection, schedule_id: int | None = None) -> Sequence[AnyRow]:
    """Every schedule with its latest run, a tick's or a trigger's (when, outcome, detail)."""
    latest = (
        select(
            schedule_runs.c.schedule_id,
            func.max(schedule_runs.c.tick_at).label("tick_at"),
        )
        .group_by(schedule_runs.c.schedule_id)
        .subquery()
    )
    return conn.execute(
        select(
            schedules,
            schedule_runs.c.tick_at.label("last_run_at"),
            schedule_runs.c.outcome.label("last_outcome"),
            schedule_runs.c.detail.label("last_detail"),
        )
        .select_from(
            schedules.outerjoin(latest, latest.c.schedule_id == schedules.c.id).outerjoin(
                schedule_runs,
                (schedule_runs.c.schedule_id == latest.c.schedule_id)
                & (schedule_runs.c.tick_at == latest.c.tick_at),
            )
        )
        .where(schedules.c.id == schedule_id if schedule_id is not None else true())
        .order_by(schedules.c.machine_type, schedules.c.name)
    ).all()


def schedule_runs_txn(conn: Connection, schedule_id: int, limit: int) -> Sequence[AnyRow]:
    return _newest_txn(conn, schedule_runs, schedule_runs.c.tick_at, schedule_id, limit)


def schedule_events_txn(conn: Connection, schedule_id: int, limit: int) -> Sequence[AnyRow]:
    return _newest_txn(conn, schedule_events, schedule_events.c.id, schedule_id, limit)


def _newest_txn(
    conn: Connection, table: Table, newest: ColumnElement[Any], schedule_id: int, limit: int
) -> Sequence[AnyRow]:
    """A schedule's rows of `table`, newest first by `newest`, at most `limit`."""
    return conn.execute(
        select(table).where(table.c.schedule_id == schedule_id).order_by(newest.desc()).limit(limit)
    ).all()


# --- liveness: when a periodic job last ran (is beat alive?) ---------------------------------


def touch_txn(conn: Connection, name: str, at: datetime) -> None:
    """Record that the periodic job called name ran at `at`."""
    statement = dialects.of(conn).insert(liveness).values(name=name, at=at)
    conn.execute(statement.on_conflict_do_update(index_elements=[liveness.c.name], set_={"at": at}))


def last_run_txn(conn: Connection, name: str) -> datetime | None:
    at: datetime | None = conn.execute(
        select(liveness.c.at).where(liveness.c.name == name)
    ).scalar()
    return at
