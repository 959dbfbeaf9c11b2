"""The embedded mode's statements (SQLite): plain SQLAlchemy Core, one row at a time.

SQLite has no row locks: the transaction takes the database's write lock at BEGIN (see
fsm_celery.store.db), which serialises writers as PostgreSQL's row locks do.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from functools import cache
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, Row, Table, Update, bindparam, insert, select, update
from sqlalchemy.dialects.sqlite import Insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert

from fsm_celery.store.rows import ById, History, Move, columns, values
from fsm_celery.store.tables import fan_out_items, machines, transitions

_FAMILY = (
    select(machines.c.id, machines.c.parent_id)
    .where(machines.c.id.in_(bindparam("ids", expanding=True)))
    .cte("family", recursive=True)
)
_ANCESTOR = machines.alias("ancestor")
_FAMILY = _FAMILY.union(
    select(_ANCESTOR.c.id, _ANCESTOR.c.parent_id).join(
        _FAMILY, _ANCESTOR.c.id == _FAMILY.c.parent_id
    )
)
_LOCK_ALONE = (
    select(machines)
    .where(machines.c.id.in_(bindparam("ids", expanding=True)))
    .order_by(machines.c.depth, machines.c.id)
)
# The machines and their ancestors, ancestors first (as PostgreSQL locks them).
_LOCK = (
    select(machines)
    .where(machines.c.id.in_(select(_FAMILY.c.id)))
    .order_by(machines.c.depth, machines.c.id)
)


class SQLite:
    def lock_machines(
        self, conn: Connection, ids: Sequence[UUID], ancestors: bool = True, skip: bool = False
    ) -> Iterable[Row[Any]]:
        """SQLite holds the whole database for a writer: nothing to skip."""
        return conn.execute(_LOCK if ancestors else _LOCK_ALONE, {"ids": list(ids)})

    def update(self, conn: Connection, table: Table, rows: Sequence[ById]) -> None:
        if not rows:
            return
        names = columns(type(rows[0]))  # the id first
        params = [{"_id": r.id, **{name: getattr(r, name) for name in names[1:]}} for r in rows]
        conn.execute(_update(table, names), params)

    def move(self, conn: Connection, moves: Sequence[Move], history: Sequence[History]) -> None:
        self.update(conn, machines, moves)
        self.insert_rows(conn, transitions, history)

    def insert_rows(
        self, conn: Connection, table: Table, rows: Sequence[Any], returning: bool = False
    ) -> list[Row[Any]]:
        if not rows:
            return []
        statement = insert(table)
        if returning:
            statement = statement.returning(*table.c, sort_by_parameter_order=True)
        params = [dict(row) if isinstance(row, Mapping) else values(row) for row in rows]
        result = conn.execute(statement, params)
        return list(result.all()) if returning else []

    def update_slots(
        self, conn: Connection, parent_id: UUID, attempt: int, slots: Sequence[Mapping[str, Any]]
    ) -> None:
        if slots:
            params = [{"_p": parent_id, "_a": attempt, "_s": s["slot"], **s} for s in slots]
            conn.execute(_update_slots(tuple(slots[0])), params)

    def insert(self, table: Table) -> Insert:
        return sqlite_insert(table)

    def snapshot(self, conn: Connection) -> str:
        """One writer at a time: what a reader sees has committed, in id order."""
        return ""

    def ended(self, conn: Connection, snapshot: str) -> bool:
        return True

    def lock_key(self, conn: Connection, key: str) -> None:
        """Nothing to take: a write transaction holds the whole database (BEGIN IMMEDIATE)."""


@cache
def _update(table: Table, names: tuple[str, ...]) -> Update:
    """UPDATE table SET each named column after the first WHERE id = :_id (a bind may not be
    named as a column the statement sets, hence _id)."""
    sets: dict[str, Any] = {name: bindparam(name) for name in names[1:]}
    return update(table).where(table.c.id == bindparam("_id")).values(sets)


@cache
def _update_slots(names: tuple[str, ...]) -> Update:
    """UPDATE a fan-out's slot (:_p, :_a, :_s) setting the named columns but its slot."""
    c = fan_out_items.c
    sets: dict[str, Any] = {name: bindparam(name) for name in names if name != "slot"}
    where = (
        c.parent_id == bindparam("_p"),
        c.attempt == bindparam("_a"),
        c.slot == bindparam("_s"),
    )
    return update(fan_out_items).where(*where).values(sets)


SQLITE = SQLite()
