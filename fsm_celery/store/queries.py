"""Every SQL statement of the engine. Helpers take a connection and never commit."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Sequence
from datetime import datetime
from functools import lru_cache
from typing import Any
from uuid import UUID

from pydantic_core import to_json
from sqlalchemy import (
    Connection,
    CursorResult,
    Row,
    Table,
    Update,
    bindparam,
    delete,
    func,
    insert,
    select,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import parse_definition
from fsm_celery.store.tables import (
    agents,
    definitions,
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
    return row.version, parse_definition(row.body, f"{machine_type} v{row.version}")


def definition_txn(conn: Connection, machine_type: str, version: int) -> MachineDefinition:
    """One stored version of a machine type."""
    body = conn.execute(
        select(definitions.c.body).where(
            definitions.c.type == machine_type, definitions.c.version == version
        )
    ).scalar_one()
    return parse_definition(body, f"{machine_type} v{version}")


def insert_machine_txn(conn: Connection, values: dict[str, Any]) -> None:
    conn.execute(insert(machines).values(**values))


def lock_machines_txn(conn: Connection, ids: Iterable[UUID]) -> dict[UUID, AnyRow]:
    """Lock the machines' rows in id order (so concurrent batches never deadlock)."""
    ordered = sorted(set(ids))
    if not ordered:
        return {}
    if conn.dialect.name == "postgresql":
        found = _execute_prepared(conn, _PG_LOCK, {"ids": _uuid_array(ordered)})
    else:
        found = conn.execute(_LOCK, {"ids": ordered})
    return {row.id: row for row in found}


_LOCK = (
    select(machines)
    .where(machines.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(machines.c.id)
    .with_for_update()
)
_PG_LOCK = (
    f"SELECT {', '.join(c.name for c in machines.c)} FROM {machines.name} "
    "WHERE id = ANY(CAST(:ids AS UUID[])) ORDER BY id FOR UPDATE"
)


def get_machine_txn(conn: Connection, machine_id: UUID) -> AnyRow | None:
    return conn.execute(select(machines).where(machines.c.id == machine_id)).first()


_UPDATE = (
    update(machines)
    .where(machines.c.id == bindparam("_id"))
    .values(
        current_state=bindparam("current_state"),
        status=bindparam("status"),
        context=bindparam("context"),
        attempt=bindparam("attempt"),
        state_retries=bindparam("state_retries"),
        handbacks=bindparam("handbacks"),
        dispatch_due_at=bindparam("dispatch_due_at"),
        deadline_at=bindparam("deadline_at"),
        heartbeat_at=bindparam("heartbeat_at"),
        progress=bindparam("progress"),
        tokens_used=bindparam("tokens_used"),
        cost=bindparam("cost"),
        entered_at=bindparam("entered_at"),
        error=bindparam("error"),
        updated_at=bindparam("updated_at"),
    )
)


def update_machines_txn(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Write each machine's decided state (rows keyed as _UPDATE's parameters)."""
    _update_rows_txn(conn, _UPDATE, rows)


def _update_rows_txn(conn: Connection, statement: Update, rows: list[dict[str, Any]]) -> None:
    """Run the per-row UPDATE for every row: on PostgreSQL as one statement over all of them."""
    if not rows:
        return
    if conn.dialect.name != "postgresql":
        conn.execute(statement, rows)
        return
    columns, document = _machine_rows(rows)
    _execute_prepared(conn, _recordset_update(columns), {"rows": document, "ids": _ids(rows)})


def move_machines_txn(
    conn: Connection, updates: list[dict[str, Any]], history: list[dict[str, Any]]
) -> None:
    """Write the machines' decided states and their history rows (keyed as _UPDATE's parameters
    and as state_transitions' columns); on PostgreSQL in one statement, one round trip."""
    if conn.dialect.name != "postgresql" or not updates or not history:
        update_machines_txn(conn, updates)
        insert_transitions_txn(conn, history)
        return
    columns, document = _machine_rows(updates)
    fields = tuple(history[0])
    _execute_prepared(
        conn,
        _move_statement(columns, fields),
        {"rows": document, "ids": _ids(updates), "history": _json_rows(history, fields)},
    )


@lru_cache(maxsize=16)
def _move_statement(columns: tuple[str, ...], fields: tuple[str, ...]) -> str:
    return f"WITH moved AS ({_recordset_update(columns)}) {_recordset_insert(fields)}"


def _execute_prepared(conn: Connection, sql: str, params: dict[str, str]) -> CursorResult[Any]:
    """Run one of the hot path's statements as a PostgreSQL prepared statement: parsed and
    planned once per connection instead of once per transaction (a quarter of the database's
    work on a small batch). `sql` names its parameters `:name`; each value is passed as text
    and typed by the statement's own CASTs. A prepared statement lives in its server session,
    so this needs a session per connection: not PgBouncer's transaction pooling."""
    name, body, order = _prepare(sql)
    prepared: set[str] = conn.connection.info.setdefault("fsm_prepared", set())
    if name not in prepared:  # a new connection (or a reconnect): PREPARE is per session
        conn.exec_driver_sql(f"PREPARE {name} AS {body}")
        prepared.add(name)
    slots = ", ".join(["%s"] * len(order))
    return conn.exec_driver_sql(f"EXECUTE {name}({slots})", tuple(params[p] for p in order))


@lru_cache(maxsize=32)
def _prepare(sql: str) -> tuple[str, str, tuple[str, ...]]:
    """The statement's name (from its text), its body with $n placeholders, and the order of
    its parameters."""
    order: list[str] = []

    def placeholder(match: re.Match[str]) -> str:
        if match.group(1) not in order:
            order.append(match.group(1))
        return f"${order.index(match.group(1)) + 1}"

    body = re.sub(r"(?<!:):(\w+)", placeholder, sql)
    return f"fsm_{hashlib.sha1(sql.encode()).hexdigest()[:16]}", body, tuple(order)


@lru_cache(maxsize=16)
def _recordset_update(columns: tuple[str, ...]) -> str:
    """UPDATE from a JSON array of rows (:rows): planned once per batch, where one statement
    per row costs a parse and a plan each.

    The planner cannot tell how many rows a JSON array holds (it guesses 100), and on a table
    of a few thousand machines it then reads the whole table to hash-join it; the array of the
    same ids (:ids), whose length it does know, makes it fetch just those rows by primary key.
    """
    sets = ", ".join(f"{c} = v.{c}" for c in columns)
    return (
        f"UPDATE {machines.name} AS m SET {sets} "
        f"FROM {_recordset(machines, 'rows', columns, 'v', '_id UUID')} "
        "WHERE m.id = ANY(CAST(:ids AS UUID[])) AND m.id = v._id"
    )


def _recordset_insert(columns: tuple[str, ...]) -> str:
    """INSERT of history rows from a JSON array (:history)."""
    names = ", ".join(columns)
    source = _recordset(transitions, "history", columns, "h")
    return f"INSERT INTO {transitions.name} ({names}) SELECT {names} FROM {source}"


def _recordset(table: Table, param: str, columns: tuple[str, ...], alias: str, *extra: str) -> str:
    """A JSON array parameter as typed rows with the table's column types."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    types = [f"{c} {table.c[c].type.compile(dialect=dialect)}" for c in columns]
    return f"jsonb_to_recordset(CAST(:{param} AS JSONB)) AS {alias}({', '.join([*extra, *types])})"


def _machine_rows(rows: list[dict[str, Any]]) -> tuple[tuple[str, ...], str]:
    """The columns the rows set (all but the key _id), and the rows as one JSON document."""
    columns = tuple(name for name in rows[0] if name != "_id")
    return columns, _json_rows(rows, ("_id", *columns))


def _ids(rows: list[dict[str, Any]]) -> str:
    return _uuid_array(row["_id"] for row in rows)


def _uuid_array(ids: Iterable[UUID]) -> str:
    """Ids as a PostgreSQL array literal, cast by the statement."""
    return "{" + ",".join(str(i) for i in ids) + "}"


def _json_rows(rows: list[dict[str, Any]], keys: tuple[str, ...]) -> str:
    """The rows as a JSON array (uuids and datetimes as text), by pydantic's serialiser, which
    is four times quicker than the json module's on a batch's rows."""
    return to_json([{k: row[k] for k in keys} for row in rows]).decode()


_HEARTBEAT = (
    update(machines)
    .where(machines.c.id == bindparam("_id"))
    .values(
        deadline_at=bindparam("deadline_at"),
        heartbeat_at=bindparam("heartbeat_at"),
        progress=bindparam("progress"),
    )
)


def update_heartbeats_txn(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Write each heartbeat's new deadline and progress."""
    _update_rows_txn(conn, _HEARTBEAT, rows)


def last_transition_txn(conn: Connection, machine_id: UUID) -> AnyRow | None:
    """The machine's latest history row."""
    return conn.execute(
        select(transitions)
        .where(transitions.c.machine_id == machine_id)
        .order_by(transitions.c.attempt.desc())
        .limit(1)
    ).first()


_DISPATCHED = (
    update(machines)
    .where(machines.c.id == bindparam("_id"))
    .values(
        dispatch_due_at=None,
        entered_at=bindparam("entered_at"),
        deadline_at=bindparam("deadline_at"),
        updated_at=bindparam("updated_at"),
    )
)


def mark_dispatched_txn(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Record each dispatch: when it was entered and its deadline (rows keyed as _DISPATCHED)."""
    _update_rows_txn(conn, _DISPATCHED, rows)


def insert_transitions_txn(conn: Connection, rows: list[dict[str, Any]]) -> None:
    if rows:
        conn.execute(insert(transitions), rows)


def insert_rejections_txn(conn: Connection, rows: list[dict[str, Any]]) -> None:
    if rows:
        for row in rows:  # PostgreSQL text cannot hold NUL: keep it visible, escaped
            row["payload"] = row["payload"][:PAYLOAD_KEEP].replace("\x00", "\\u0000")
            row["detail"] = row["detail"].replace("\x00", "\\u0000")
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


def upsert_agents_txn(conn: Connection, rows: list[dict[str, Any]]) -> None:
    """Record each agent's latest status (insert the first time it is seen)."""
    if not rows:
        return
    dialect = conn.dialect.name
    insert_fn = pg_insert if dialect == "postgresql" else sqlite_insert
    statement = insert_fn(agents)
    changed = ("agent_type", "status", "concurrency", "running", "hostname", "last_seen_at")
    statement = statement.on_conflict_do_update(
        index_elements=[agents.c.id],
        set_={name: statement.excluded[name] for name in changed},
    )
    conn.execute(statement, rows)


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
    dialect_insert = pg_insert if conn.dialect.name == "postgresql" else sqlite_insert
    statement = dialect_insert(agents).values(
        id=agent_id,
        agent_type=agent_type,
        registered_type=agent_type,
        status="stopped",
        concurrency=1,
        running=0,
        started_at=now,
        last_seen_at=now,
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
