"""The statements whose SQL differs between PostgreSQL and SQLite, each dialect in one place.

queries.py asks `of(conn)` once per call and stays free of dialect branches; postgres.py and
sqlite.py each hold their dialect's version of every statement below.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Protocol
from uuid import UUID

from sqlalchemy import Connection, Row, Table
from sqlalchemy.dialects.postgresql import Insert as PgInsert
from sqlalchemy.dialects.sqlite import Insert as SqliteInsert

from fsm_celery.store import postgres, sqlite
from fsm_celery.store.rows import ById, History, Move


class Dialect(Protocol):
    def lock_machines(
        self, conn: Connection, ids: Sequence[UUID], ancestors: bool = True, skip: bool = False
    ) -> Iterable[Row[Any]]:
        """Lock the machines' rows and their ancestors', by depth then id (ancestors first:
        concurrent transactions never deadlock)."""
        ...

    def update(self, conn: Connection, table: Table, rows: Sequence[ById]) -> None:
        """UPDATE each row of the table by its id, setting the row's other fields."""
        ...

    def move(self, conn: Connection, moves: Sequence[Move], history: Sequence[History]) -> None:
        """Write the machines' new states and the history rows of their attempts."""
        ...

    def insert_rows(
        self, conn: Connection, table: Table, rows: Sequence[Any], returning: bool = False
    ) -> list[Row[Any]]:
        """INSERT the rows (dataclasses of fsm_celery.store.rows, all of one type, or mappings
        of the same columns); with `returning`, the rows as stored (the database's defaults
        filled in), in no set order."""
        ...

    def update_slots(
        self, conn: Connection, parent_id: UUID, attempt: int, slots: Sequence[Mapping[str, Any]]
    ) -> None:
        """Set a fan-out's slots: each mapping names its slot and the columns to set (the same
        columns in all)."""
        ...

    def insert(self, table: Table) -> PgInsert | SqliteInsert:
        """An INSERT that can turn into an update on conflict (an upsert)."""
        ...

    def snapshot(self, conn: Connection) -> str:
        """Which transactions are in flight now, to be asked later whether they all ended."""
        ...

    def ended(self, conn: Connection, snapshot: str) -> bool:
        """Whether every transaction in flight at the snapshot has committed or rolled back."""
        ...

    def lock_key(self, conn: Connection, key: str) -> None:
        """Hold a lock named key until the transaction ends (two transactions that take the
        same key run one after the other)."""
        ...


def of(conn: Connection) -> Dialect:
    """The statements for the connection's database."""
    return postgres.POSTGRESQL if conn.dialect.name == "postgresql" else sqlite.SQLITE
