"""Schedules: beat starts a machine of a definition on each of its cron ticks; operators list,
pause, resume and trigger them (fsm_celery.core.schedule has the arithmetic of ticks).

A tick starts at most one machine however many beats run: each beat locks the due schedules
with SKIP LOCKED, and the tick is a row whose primary key (schedule, tick) a second beat cannot
insert again; the machine is inserted in the same transaction as that row. Changes are rows of
schedule_events (who, when, why).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from uuid import UUID

import sqlalchemy.exc
from sqlalchemy import Connection

from fsm_celery.core.schedule import Overlap, due, next_tick
from fsm_celery.core.start_key import Started
from fsm_celery.core.steps import Next
from fsm_celery.core.timeline import ACTOR_CHARS
from fsm_celery.core.transition import MachineStatus
from fsm_celery.engine.admin import Admin
from fsm_celery.engine.runtime import Runtime
from fsm_celery.exceptions import FsmError, InvalidActor, ScheduleNotFound
from fsm_celery.store import schedules as store
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.writes import Writes

log = logging.getLogger(__name__)
UNFINISHED = {MachineStatus.RUNNING.value, MachineStatus.PAUSED.value}


@dataclass(frozen=True)
class ScheduleInfo:
    machine_type: str
    name: str
    cron: str
    timezone: str
    overlap: str
    context: dict[str, Any]
    paused: bool
    removed: bool
    next_run_at: datetime
    last_tick_at: datetime | None
    last_machine_id: UUID | None
    last_run_at: datetime | None  # the latest run, a tick's or a trigger's
    last_outcome: str | None
    last_detail: str | None

    @property
    def key(self) -> str:
        return f"{self.machine_type}/{self.name}"


class Schedules:
    def __init__(self, runtime: Runtime, admin: Admin) -> None:
        self._rt = runtime
        self._admin = admin

    def run(self, limit: int = 100) -> tuple[int, Next]:
        """Start a machine for each schedule whose tick is due: how many schedules were due, and
        the machines' first states to enter. A tick missed while no beat ran is run once."""
        writes = Writes(self._rt.clock())
        now = writes.now
        next_states: Next = []
        with self._rt.transaction(writes) as conn:
            rows = store.lock_due_schedules_txn(conn, now, limit)
            for row in rows:
                tick, following = due(row.cron, row.timezone, row.next_run_at, now)
                update: dict[str, Any] = {"next_run_at": following, "last_tick_at": tick}
                if store.claim_tick_txn(conn, row.id, tick, "started"):
                    started = self._tick(conn, writes, row, tick)
                    if started is not None:
                        next_states += started.next
                        update["last_machine_id"] = started.machine_id
                store.update_schedule_txn(conn, row.id, **update)
            store.touch_txn(conn, "schedules", now)
        return len(rows), next_states

    def _tick(
        self, conn: Connection, writes: Writes, row: AnyRow, tick: datetime
    ) -> Started | None:
        """Start the tick's machine, or find the one its key holds (None: skipped, or failed;
        the run row says which)."""
        if row.overlap == Overlap.SKIP and row.last_machine_id is not None:
            status = store.machine_status_txn(conn, row.last_machine_id)
            if status in UNFINISHED:
                detail = f"machine {row.last_machine_id} is still {status}"
                store.record_tick_txn(conn, row.id, tick, "skipped", detail=detail)
                return None
        try:
            with conn.begin_nested():  # a failure of this schedule leaves the others' ticks
                started = self._admin.start_txn(
                    conn, writes, row.machine_type, row.context, key=tick_key(row, tick)
                )
        except sqlalchemy.exc.OperationalError:
            raise
        except (FsmError, sqlalchemy.exc.SQLAlchemyError) as exc:
            log.warning(
                "schedule %s/%s could not start a machine: %s", row.machine_type, row.name, exc
            )
            store.record_tick_txn(conn, row.id, tick, "failed", detail=str(exc)[:1000])
            return None
        store.record_tick_txn(conn, row.id, tick, "started", machine_id=started.machine_id)
        return started

    def all(self) -> list[ScheduleInfo]:
        with self._rt.db.connect() as conn:
            return [_info(row) for row in store.list_schedules_txn(conn)]

    def one(self, ref: str) -> ScheduleInfo:
        """The schedule named ref (TYPE/NAME, or TYPE), with its latest run."""
        with self._rt.db.connect() as conn:
            return _info(store.list_schedules_txn(conn, self._find(conn, ref).id)[0])

    def history(self, ref: str, limit: int = 20) -> tuple[Sequence[Any], Sequence[Any]]:
        """The schedule's latest runs and the latest changes made to it."""
        with self._rt.db.connect() as conn:
            row = self._find(conn, ref)
            return store.schedule_runs_txn(conn, row.id, limit), store.schedule_events_txn(
                conn, row.id, limit
            )

    def pause(self, ref: str, actor: str, reason: str = "") -> ScheduleInfo:
        """Start no more machines on the schedule's ticks (until resumed)."""
        return self._set_paused(ref, True, actor, reason)

    def resume(self, ref: str, actor: str, reason: str = "") -> ScheduleInfo:
        """Start machines again from the next tick on (ticks while paused are not run)."""
        return self._set_paused(ref, False, actor, reason)

    def _set_paused(self, ref: str, paused: bool, actor: str, reason: str) -> ScheduleInfo:
        _check_actor(actor)
        now = self._rt.clock()
        with self._rt.db.begin() as conn:
            row = self._find(conn, ref)
            update: dict[str, Any] = {"paused": paused, "updated_at": now}
            if not paused:
                update["next_run_at"] = next_tick(row.cron, row.timezone, now)
            if row.paused != paused:
                store.update_schedule_txn(conn, row.id, **update)
                store.schedule_event_txn(
                    conn, row.id, "pause" if paused else "resume", actor, reason
                )
            row = self._find(conn, ref)
        return _info(row)

    def trigger(self, ref: str, actor: str, reason: str = "") -> Next:
        """Start a machine of the schedule now, whatever its ticks, overlap and pause."""
        _check_actor(actor)
        writes = Writes(self._rt.clock())
        now = writes.now
        with self._rt.transaction(writes) as conn:
            row = self._find(conn, ref)
            key = tick_key(row, now)
            started = self._admin.start_txn(conn, writes, row.machine_type, row.context, key=key)
            mid = started.machine_id
            store.claim_tick_txn(conn, row.id, now, "started")
            store.record_tick_txn(conn, row.id, now, "started", mid, "triggered", actor)
            store.update_schedule_txn(conn, row.id, last_machine_id=mid)
            store.schedule_event_txn(
                conn, row.id, "trigger", actor, reason, {"machine_id": str(mid)}
            )
        return started.next

    def _find(self, conn: Connection, ref: str) -> AnyRow:
        """The schedule named TYPE/NAME, or TYPE when the type has one schedule."""
        machine_type, _, name = ref.partition("/")
        if not name:
            names = [
                n
                for n, r in store.schedules_of_txn(conn, machine_type).items()
                if r.removed_at is None
            ]
            if len(names) != 1:
                raise ScheduleNotFound(ref, _choices(conn, machine_type, names))
            name = names[0]
        row = store.lock_schedule_txn(conn, machine_type, name)
        if row is None:
            raise ScheduleNotFound(ref, _choices(conn, machine_type, None))
        return row


def tick_key(row: AnyRow, tick: datetime) -> str:
    """The start key of the machine a schedule's run starts, `schedule:TYPE/NAME:<tick, UTC,
    ISO 8601>` (a trigger's tick: when it ran): visible on the machine, and a start given the
    same key finds that machine."""
    if tick.tzinfo is None:  # SQLite hands back naive datetimes, stored in UTC
        tick = tick.replace(tzinfo=UTC)
    return f"schedule:{row.machine_type}/{row.name}:{tick.astimezone(UTC).isoformat()}"


def _check_actor(actor: str) -> None:
    if len(actor) > ACTOR_CHARS:
        raise InvalidActor(actor, ACTOR_CHARS)


def _choices(conn: Connection, machine_type: str, names: Iterable[str] | None) -> list[str]:
    if names is None:
        names = store.schedules_of_txn(conn, machine_type)
    return [f"{machine_type}/{n}" for n in names] or [
        info.key for info in map(_info, store.list_schedules_txn(conn))
    ]


def _info(row: Any) -> ScheduleInfo:
    return ScheduleInfo(
        machine_type=row.machine_type,
        name=row.name,
        cron=row.cron,
        timezone=row.timezone,
        overlap=row.overlap,
        context=row.context,
        paused=row.paused,
        removed=row.removed_at is not None,
        next_run_at=row.next_run_at,
        last_tick_at=row.last_tick_at,
        last_machine_id=row.last_machine_id,
        last_run_at=getattr(row, "last_run_at", None),
        last_outcome=getattr(row, "last_outcome", None),
        last_detail=getattr(row, "last_detail", None),
    )
