"""PostgreSQL's statements for the hot path: a whole batch in one statement, prepared once.

A transaction of the hot path locks its machines, then updates them and records their
attempts. Each of those is one statement over the whole batch, its rows passed as one JSON
document, and each statement is parsed and planned once per connection (a PREPAREd statement)
instead of once per transaction: together a quarter of the database's work on a small batch.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import cache, lru_cache
from typing import Any
from uuid import UUID

from pydantic_core import to_json
from sqlalchemy import Connection, CursorResult, Row, Table, exc, text
from sqlalchemy.dialects import postgresql
from sqlalchemy.dialects.postgresql import Insert
from sqlalchemy.dialects.postgresql import insert as pg_insert

from fsm_celery.store.rows import ById, History, Move, columns
from fsm_celery.store.tables import fan_out_items, machines, transitions

PREPARE = "fsm_prepare"  # an engine's execution option: the hot statements prepared per session
STATEMENT_GONE = "26000"  # invalid_sql_statement_name: EXECUTE of a statement the session lacks
log = logging.getLogger(__name__)

_MACHINE_COLUMNS = ", ".join(c.name for c in machines.c)

# The machines and their ancestors (a child's parent_id never changes: read without a lock),
# locked ancestors first: by depth, then id (docs/fan-out.md, "Lock order"). `= ANY(ARRAY(...))`,
# not `IN (SELECT ...)`: the planner guesses a recursive CTE's rows at some 200, and joins that
# many to a table of a few thousand machines by reading all of it; an array it looks up by key.
_LOCK = (
    "WITH RECURSIVE family(id, parent_id) AS ("
    f"SELECT id, parent_id FROM {machines.name} WHERE id = ANY(CAST(:ids AS UUID[])) "
    f"UNION SELECT m.id, m.parent_id FROM {machines.name} m JOIN family f ON m.id = f.parent_id) "
    f"SELECT {_MACHINE_COLUMNS} FROM {machines.name} "
    "WHERE id = ANY(ARRAY(SELECT id FROM family)) ORDER BY depth, id FOR UPDATE"
)
_LOCK_ALONE = (
    f"SELECT {_MACHINE_COLUMNS} FROM {machines.name} "
    "WHERE id = ANY(CAST(:ids AS UUID[])) ORDER BY depth, id FOR UPDATE"
)


class PostgreSQL:
    def lock_machines(
        self, conn: Connection, ids: Sequence[UUID], ancestors: bool = True, skip: bool = False
    ) -> Iterable[Row[Any]]:
        sql = (_LOCK if ancestors else _LOCK_ALONE) + (" SKIP LOCKED" if skip else "")
        return _execute_prepared(conn, sql, {"ids": _uuid_array(ids)})

    def update(self, conn: Connection, table: Table, rows: Sequence[ById]) -> None:
        if not rows:
            return
        sql = _update(table, columns(type(rows[0])))
        _execute_prepared(conn, sql, {"rows": _json(rows), "ids": _ids(rows)})

    def move(self, conn: Connection, moves: Sequence[Move], history: Sequence[History]) -> None:
        """Both in one statement, one round trip (the UPDATE as a data-modifying CTE)."""
        if not moves or not history:
            self.update(conn, machines, moves)
            self.insert_rows(conn, transitions, history)
            return
        _execute_prepared(
            conn,
            _move(columns(Move), columns(History)),
            {"rows": _json(moves), "ids": _ids(moves), "history": _json(history)},
        )

    def insert_rows(
        self, conn: Connection, table: Table, rows: Sequence[Any], returning: bool = False
    ) -> list[Row[Any]]:
        """One prepared statement over the rows as one JSON document (a fan-out's slots, its
        children and their start records: a statement and a parse for a batch, not one a
        row)."""
        if not rows:
            return []
        first = rows[0]
        names = tuple(first) if isinstance(first, Mapping) else columns(type(first))
        sql = _insert(table, "rows", names)
        if returning:
            sql += " RETURNING " + ", ".join(c.name for c in table.c)
        result = _execute_prepared(conn, sql, {"rows": _json(rows)})
        return list(result.all()) if returning else []

    def update_slots(
        self, conn: Connection, parent_id: UUID, attempt: int, slots: Sequence[Mapping[str, Any]]
    ) -> None:
        if not slots:
            return
        params = {
            "rows": _json(slots),
            "parent": str(parent_id),
            "attempt": str(attempt),
            "slots": "{" + ",".join(str(s["slot"]) for s in slots) + "}",
            "first": str(min(s["slot"] for s in slots)),
            "last": str(max(s["slot"] for s in slots)),
        }
        _execute_prepared(conn, _update_slots(tuple(slots[0])), params)

    def insert(self, table: Table) -> Insert:
        return pg_insert(table)

    def snapshot(self, conn: Connection) -> str:
        """The next transaction id to be assigned: every transaction in flight now has a
        smaller one (short enough for its column however many are in flight)."""
        return str(conn.execute(text("SELECT pg_snapshot_xmax(pg_current_snapshot())")).scalar())

    def ended(self, conn: Connection, snapshot: str) -> bool:
        """Whether every transaction of this database that was in flight at the snapshot has
        ended. Only this database's (pg_stat_activity.backend_xid, 32 bits, matched against the
        snapshot's 64-bit ids): a long transaction in another database of the same server
        writes no history here and must not hold the fold back."""
        noted = snapshot.split(":")[1] if ":" in snapshot else snapshot  # older rows: a snapshot
        ended = conn.execute(
            text(
                "SELECT NOT EXISTS ("
                " SELECT 1 FROM pg_snapshot_xip(pg_current_snapshot()) AS x"
                " WHERE x < CAST(:noted AS xid8)"
                " AND (CAST(CAST(x AS text) AS bigint) % 4294967296)::text IN ("
                "  SELECT backend_xid::text FROM pg_stat_activity"
                "  WHERE datname = current_database() AND backend_xid IS NOT NULL))"
            ),
            {"noted": noted},
        ).scalar_one()
        return bool(ended)

    def lock_key(self, conn: Connection, key: str) -> None:
        conn.execute(text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"), {"key": key})


POSTGRESQL = PostgreSQL()


def _execute_prepared(conn: Connection, sql: str, params: dict[str, str]) -> CursorResult[Any]:
    """Run a statement as a PostgreSQL prepared statement. `sql` names its parameters `:name`;
    each value is passed as text and typed by the statement's own CASTs. A prepared statement
    lives in its server session, so this needs a session per connection: behind PgBouncer's
    transaction pooling (the engine's PREPARE option false: FSM_DATABASE_PREPARE) the statement
    is sent whole instead, its values interpolated by the driver."""
    if not conn.get_execution_options().get(PREPARE, True):  # behind a transaction pooler
        return conn.exec_driver_sql(_named(sql), params)
    name, body, order = _prepare(sql)
    prepared: set[str] = conn.connection.info.setdefault("fsm_prepared", set())
    try:
        if name not in prepared:  # a new connection (or a reconnect): PREPARE is per session
            conn.exec_driver_sql(f"PREPARE {name} AS {body}")
            prepared.add(name)
        slots = ", ".join(["%s"] * len(order))
        return conn.exec_driver_sql(f"EXECUTE {name}({slots})", tuple(params[p] for p in order))
    except exc.DBAPIError as error:
        if getattr(error.orig, "pgcode", None) == STATEMENT_GONE:
            # A pooler gave this transaction another session than the one that prepared it:
            # the engine sends its statements whole from now on, and the transaction (a
            # connection error to SQLAlchemy) is tried again by its caller.
            prepared.clear()
            conn.engine.update_execution_options(**{PREPARE: False})
            log.warning(
                "the database's sessions do not keep prepared statements (a pooler in "
                "transaction mode?): statements are sent whole from now on; set "
                "FSM_DATABASE_PREPARE=false to start so"
            )
        raise


@lru_cache(maxsize=32)
def _named(sql: str) -> str:
    """The statement with the driver's named placeholders (sent whole with its values)."""
    return re.sub(r"(?<!:):(\w+)", r"%(\1)s", sql.replace("%", "%%"))


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


@cache
def _update(table: Table, names: tuple[str, ...]) -> str:
    """UPDATE from a JSON array of rows (:rows) keyed by id, the first of `names`.

    The planner cannot tell how many rows a JSON array holds (it guesses 100), and on a table
    of a few thousand machines it then reads the whole table to hash-join it; the array of the
    same ids (:ids), whose length it does know, makes it fetch just those rows by primary key.
    """
    sets = ", ".join(f"{name} = v.{name}" for name in names[1:])
    return (
        f"UPDATE {table.name} AS t SET {sets} FROM {_recordset(table, 'rows', names, 'v')} "
        "WHERE t.id = ANY(CAST(:ids AS UUID[])) AND t.id = v.id"
    )


@cache
def _update_slots(names: tuple[str, ...]) -> str:
    """UPDATE a fan-out's slots from a JSON array of rows (:rows), each with its slot; the slots
    also as an array (:slots), filtered before the join, and their range (:first, :last) that
    the index scan is bounded by: the planner, blind to a JSON array's rows, applies the array
    as a filter over every slot of the fan-out (10,000 rows read for a batch of a 10,000-item
    map), a range it reads as part of the key (as fanouts.inputs_txn does)."""
    sets = ", ".join(f"{name} = v.{name}" for name in names if name != "slot")
    return (
        f"UPDATE {fan_out_items.name} AS t SET {sets} "
        f"FROM {_recordset(fan_out_items, 'rows', names, 'v')} "
        "WHERE t.parent_id = CAST(:parent AS UUID) AND t.attempt = CAST(:attempt AS INTEGER) "
        "AND t.slot BETWEEN CAST(:first AS INTEGER) AND CAST(:last AS INTEGER) "
        "AND t.slot = ANY(CAST(:slots AS INTEGER[])) AND t.slot = v.slot"
    )


@cache
def _insert(table: Table, param: str, names: tuple[str, ...]) -> str:
    """INSERT of rows from a JSON array (:param)."""
    listed = ", ".join(names)
    return (
        f"INSERT INTO {table.name} ({listed}) "
        f"SELECT {listed} FROM {_recordset(table, param, names, 'r')}"
    )


@cache
def _move(moves: tuple[str, ...], history: tuple[str, ...]) -> str:
    return f"WITH moved AS ({_update(machines, moves)}) {_insert(transitions, 'history', history)}"


def _recordset(table: Table, param: str, names: tuple[str, ...], alias: str) -> str:
    """A JSON array parameter as typed rows with the table's column types."""
    dialect = postgresql.dialect()  # type: ignore[no-untyped-call]
    typed = ", ".join(f"{n} {table.c[n].type.compile(dialect=dialect)}" for n in names)
    return f"jsonb_to_recordset(CAST(:{param} AS JSONB)) AS {alias}({typed})"


def _json(rows: Sequence[Any]) -> str:
    """The rows as a JSON array (uuids and datetimes as text), by pydantic's serialiser, which
    is four times quicker than the json module's on a batch's rows."""
    return to_json(rows).decode()


def _ids(rows: Sequence[ById]) -> str:
    return _uuid_array(row.id for row in rows)


def _uuid_array(ids: Iterable[UUID]) -> str:
    """Ids as a PostgreSQL array literal, cast by the statement."""
    return "{" + ",".join(str(i) for i in ids) + "}"
