"""Every SQL statement of the engine. Helpers take a connection and never commit.

What differs between PostgreSQL and SQLite lives in fsm_celery.store.postgres and .sqlite;
the rows written are typed in fsm_celery.store.rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Row, delete, func, insert, select, true, update

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import parse_definition
from fsm_celery.core.schedule import Schedule, next_tick
from fsm_celery.store import dialects
from fsm_celery.store.rows import (
    AgentReport,
    Beat,
    Dispatch,
    History,
    Move,
    NewMachine,
    Rejection,
    values,
)
from fsm_celery.store.tables import (
    agents,
    budget_changes,
    definitions,
    liveness,
    machines,
    rejected_messages,
    schedule_events,
    schedule_runs,
    schedules,
    transitions,
)

AnyRow = Row[*tuple[Any, ...]]
LOADER = "definitions load"  # the actor of the schedule changes a load makes
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
    return row.version, parse_definition(row.body, f"{machine_type} v{row.version}")


def definition_txn(conn: Connection, machine_type: str, version: int) -> MachineDefinition:
    """One stored version of a machine type."""
    body = conn.execute(
        select(definitions.c.body).where(
            definitions.c.type == machine_type, definitions.c.version == version
        )
    ).scalar_one()
    return parse_definition(body, f"{machine_type} v{version}")


def insert_machine_txn(conn: Connection, machine: NewMachine) -> None:
    conn.execute(insert(machines).values(**values(machine)))


def lock_machines_txn(conn: Connection, ids: Iterable[UUID]) -> dict[UUID, AnyRow]:
    """Lock the machines' rows in id order (so concurrent batches never deadlock)."""
    ordered = sorted(set(ids))
    if not ordered:
        return {}
    return {row.id: row for row in dialects.of(conn).lock_machines(conn, ordered)}


def get_machine_txn(conn: Connection, machine_id: UUID) -> AnyRow | None:
    return conn.execute(select(machines).where(machines.c.id == machine_id)).first()


def move_machines_txn(conn: Connection, moves: Sequence[Move], history: Sequence[History]) -> None:
    """Write the machines' decided states and the history rows of their attempts."""
    dialects.of(conn).move(conn, moves, history)


def update_heartbeats_txn(conn: Connection, beats: Sequence[Beat]) -> None:
    """Write each heartbeat's new deadline and progress."""
    dialects.of(conn).update(conn, machines, beats)


def mark_dispatched_txn(conn: Connection, dispatches: Sequence[Dispatch]) -> None:
    """Record each dispatch: when its state was entered and its deadline."""
    dialects.of(conn).update(conn, machines, dispatches)


def last_transition_txn(conn: Connection, machine_id: UUID) -> AnyRow | None:
    """The machine's latest history row."""
    return conn.execute(
        select(transitions)
        .where(transitions.c.machine_id == machine_id)
        .order_by(transitions.c.attempt.desc())
        .limit(1)
    ).first()


def insert_transitions_txn(conn: Connection, history: Sequence[History]) -> None:
    if history:
        conn.execute(insert(transitions), [values(h) for h in history])


def insert_rejections_txn(conn: Connection, rejections: Sequence[Rejection]) -> None:
    """Record rejected messages (PostgreSQL text cannot hold NUL: it is kept visible, escaped;
    a payload is cut to what is worth keeping)."""
    if rejections:
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
        .where(transitions.c.machine_id == machine_id)
        .order_by(transitions.c.attempt)
    ).all()


def list_machines_txn(
    conn: Connection,
    *,
    agent_type: str | None = None,
    status: str | None = None,
    machine_type: str | None = None,
    limit: int = 100,
) -> Sequence[AnyRow]:
    query = select(machines).order_by(machines.c.created_at.desc(), machines.c.id).limit(limit)
    if agent_type is not None:
        query = query.where(machines.c.agent_type == agent_type)
    if status is not None:
        query = query.where(machines.c.status == status)
    if machine_type is not None:
        query = query.where(machines.c.type == machine_type)
    return conn.execute(query).all()


def status_counts_txn(conn: Connection) -> Sequence[AnyRow]:
    """Machines counted by type and status."""
    return conn.execute(
        select(machines.c.type, machines.c.status, func.count().label("total"))
        .group_by(machines.c.type, machines.c.status)
        .order_by(machines.c.type, machines.c.status)
    ).all()


def rejection_counts_txn(conn: Connection) -> Sequence[AnyRow]:
    return conn.execute(
        select(rejected_messages.c.reason, func.count().label("total"))
        .group_by(rejected_messages.c.reason)
        .order_by(rejected_messages.c.reason)
    ).all()


def rejections_txn(
    conn: Connection, machine_id: UUID | None = None, limit: int = 100
) -> Sequence[AnyRow]:
    query = select(rejected_messages).order_by(rejected_messages.c.id.desc()).limit(limit)
    if machine_id is not None:
        query = query.where(rejected_messages.c.machine_id == machine_id)
    return conn.execute(query).all()


def lock_overdue_txn(conn: Connection, now: datetime, limit: int) -> Sequence[AnyRow]:
    """Lock running, dispatched machines whose deadline passed (skipping rows others hold)."""
    return conn.execute(
        select(machines)
        .where(
            machines.c.status == "running",
            machines.c.dispatch_due_at.is_(None),
            machines.c.deadline_at <= now,
        )
        .order_by(machines.c.deadline_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


def lock_due_txn(conn: Connection, now: datetime, limit: int) -> Sequence[AnyRow]:
    """Lock running machines whose next state is due to be dispatched (skipping held rows)."""
    return conn.execute(
        select(machines)
        .where(machines.c.status == "running", machines.c.dispatch_due_at <= now)
        .order_by(machines.c.dispatch_due_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()


def upsert_agents_txn(conn: Connection, reports: Sequence[AgentReport]) -> None:
    """Record each agent's latest status (insert the first time it is seen)."""
    if not reports:
        return
    statement = dialects.of(conn).insert(agents)
    changed = ("agent_type", "status", "concurrency", "running", "hostname", "last_seen_at")
    statement = statement.on_conflict_do_update(
        index_elements=[agents.c.id],
        set_={name: statement.excluded[name] for name in changed},
    )
    conn.execute(statement, [values(r) for r in reports])


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


def prune_agents_txn(conn: Connection, before: datetime, limit: int) -> int:
    """Delete up to limit agents not seen since `before` and not registered; how many were."""
    dead = (
        select(agents.c.id)
        .where(agents.c.last_seen_at < before, agents.c.registered_type.is_(None))
        .limit(limit)
    )
    doomed = [row.id for row in conn.execute(dead)]
    if doomed:
        conn.execute(delete(agents).where(agents.c.id.in_(doomed)))
    return len(doomed)


def agent_types_txn(conn: Connection, ids: Sequence[UUID]) -> dict[UUID, str]:
    """The type each agent serves: the one it was registered with, else the one it reported."""
    rows = conn.execute(
        select(agents.c.id, func.coalesce(agents.c.registered_type, agents.c.agent_type)).where(
            agents.c.id.in_(ids)
        )
    ).all()
    return {row[0]: row[1] for row in rows}


def registered_types_txn(conn: Connection, ids: Sequence[UUID]) -> dict[UUID, str]:
    """The type each of the agents was registered with (agents never registered are left out)."""
    if not ids:
        return {}
    rows = conn.execute(
        select(agents.c.id, agents.c.registered_type).where(
            agents.c.id.in_(ids), agents.c.registered_type.is_not(None)
        )
    ).all()
    return {row[0]: row[1] for row in rows}


def register_agent_txn(conn: Connection, agent_id: UUID, agent_type: str, now: datetime) -> None:
    """Record that the agent holds credentials to serve the type (it is not live until it
    reports)."""
    statement = (
        dialects.of(conn)
        .insert(agents)
        .values(
            id=agent_id,
            agent_type=agent_type,
            registered_type=agent_type,
            status="stopped",
            concurrency=1,
            running=0,
            started_at=now,
            last_seen_at=now,
        )
    )
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=[agents.c.id],
            set_={"registered_type": agent_type, "agent_type": agent_type},
        )
    )


def agent_alive_txn(conn: Connection, agent_id: UUID, since: datetime) -> bool:
    """Whether the agent said it is active at or after `since`."""
    found = conn.execute(
        select(agents.c.id).where(
            agents.c.id == agent_id, agents.c.status == "active", agents.c.last_seen_at >= since
        )
    ).first()
    return found is not None


def pick_agent_txn(
    conn: Connection, agent_type: str, since: datetime, now: datetime
) -> UUID | None:
    """The live agent of the type assigned least recently (round robin), marked as assigned."""
    chosen = conn.execute(
        select(agents.c.id)
        .where(
            agents.c.agent_type == agent_type,
            agents.c.status == "active",
            agents.c.last_seen_at >= since,
        )
        .order_by(agents.c.assigned_at.asc().nulls_first(), agents.c.id)
        .limit(1)
        .with_for_update(skip_locked=True)
    ).scalar()
    if chosen is not None:
        conn.execute(update(agents).where(agents.c.id == chosen).values(assigned_at=now))
    return chosen


def assign_agent_txn(conn: Connection, machine_id: UUID, agent_id: UUID) -> None:
    conn.execute(update(machines).where(machines.c.id == machine_id).values(agent_id=agent_id))


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
    return conn.execute(
        select(budget_changes)
        .where(budget_changes.c.machine_id == machine_id)
        .order_by(budget_changes.c.id)
    ).all()


def list_agents_txn(conn: Connection) -> Sequence[AnyRow]:
    return conn.execute(select(agents).order_by(agents.c.agent_type, agents.c.started_at)).all()


def usage_by_txn(conn: Connection, column: str) -> Sequence[AnyRow]:
    """Tokens and cost summed per machine type ("type") or per agent ("agent_id")."""
    key = machines.c.type if column == "type" else transitions.c.agent_id
    return conn.execute(
        select(
            key.label("key"),
            func.sum(transitions.c.tokens_used).label("tokens"),
            func.sum(transitions.c.cost).label("cost"),
            func.count().label("attempts"),
        )
        .select_from(transitions.join(machines, machines.c.id == transitions.c.machine_id))
        .where(transitions.c.event.in_(["ack", "timeout"]))
        .group_by(key)
        .order_by(key)
    ).all()


# --- schedules -------------------------------------------------------------------------------


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


def settle_tick_txn(
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
    return conn.execute(
        select(schedule_runs)
        .where(schedule_runs.c.schedule_id == schedule_id)
        .order_by(schedule_runs.c.tick_at.desc())
        .limit(limit)
    ).all()


def schedule_events_txn(conn: Connection, schedule_id: int, limit: int) -> Sequence[AnyRow]:
    return conn.execute(
        select(schedule_events)
        .where(schedule_events.c.schedule_id == schedule_id)
        .order_by(schedule_events.c.id.desc())
        .limit(limit)
    ).all()


# --- liveness --------------------------------------------------------------------------------


def touch_txn(conn: Connection, name: str, at: datetime) -> None:
    """Record that the periodic job called name ran at `at`."""
    statement = dialects.of(conn).insert(liveness).values(name=name, at=at)
    conn.execute(statement.on_conflict_do_update(index_elements=[liveness.c.name], set_={"at": at}))


def last_run_txn(conn: Connection, name: str) -> datetime | None:
    at: datetime | None = conn.execute(
        select(liveness.c.at).where(liveness.c.name == name)
    ).scalar()
    return at
