"""Database connections (SQLAlchemy engines, called `db` throughout: in this project "engine"
means the machine engine) and schema migrations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event

MIGRATIONS = Path(__file__).parent / "migrations"


def connect(url: str, pool_size: int = 5, pre_ping: bool = True) -> Engine:
    """A connection pool for the URL: pooled for PostgreSQL, WAL-journaled for SQLite.

    pre_ping tests each connection taken from the pool, a round trip per transaction, so that a
    caller never sees a connection a database restart broke. A process that retries its work on
    connection errors anyway (the ack bridge) goes without: the first error after a restart
    discards the whole pool, and the retry runs on a new connection.
    """
    if url.startswith("sqlite"):
        db = create_engine(url, connect_args={"check_same_thread": False, "timeout": 30})
        event.listen(db, "connect", _sqlite_pragmas)
        event.listen(db, "begin", _sqlite_begin_immediate)
        return db
    return create_engine(
        url,
        pool_size=pool_size,
        max_overflow=pool_size,
        pool_pre_ping=pre_ping,
        # batch UPDATE executemany too (not only INSERT): one round trip per page, not per row
        executemany_mode="values_plus_batch",
    )


def _sqlite_pragmas(dbapi_connection: Any, _record: object) -> None:
    dbapi_connection.isolation_level = None  # let the begin listener open transactions
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.close()


def _sqlite_begin_immediate(conn: Connection) -> None:
    # SQLite has no SELECT ... FOR UPDATE: taking the write lock at BEGIN serialises
    # transactions the way the row locks do on PostgreSQL.
    conn.exec_driver_sql("BEGIN IMMEDIATE")


def alembic_config(url: str) -> Config:
    """An Alembic configuration pointing at the packaged migrations."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def upgrade(db: Engine, revision: str = "head") -> None:
    """Bring the schema up to the revision."""
    config = alembic_config(str(db.url))
    with db.begin() as conn:
        config.attributes["connection"] = conn
        command.upgrade(config, revision)


def current_revision(db: Engine) -> str | None:
    """The schema revision the database is at, or None before the first migration."""
    from alembic.runtime.migration import MigrationContext

    with db.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()
