"""Database connections (SQLAlchemy engines, called `db` throughout: in this project "engine"
means the machine engine) and schema migrations."""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from sqlalchemy import Connection, Engine, create_engine, event, exc, text
from sqlalchemy.engine import URL, make_url

from fsm_celery.exceptions import DatabaseNotCreated
from fsm_celery.store.postgres import PREPARE

MIGRATIONS = Path(__file__).parent / "migrations"
# What PostgreSQL answers a connection to a database it does not have (libpq's connection
# errors carry no SQLSTATE, so the text is all there is).
MISSING_DATABASE = re.compile(r'database "(?P<name>.*)" does not exist')
# Where CREATE DATABASE is sent from: every server has one of these.
MAINTENANCE_DATABASES = ("postgres", "template1")
DUPLICATE_DATABASE = "42P04"


def connect(url: str, pool_size: int = 5, pre_ping: bool = True, prepare: bool = True) -> Engine:
    """A connection pool for the URL: pooled for PostgreSQL, WAL-journaled for SQLite.

    pre_ping tests each connection taken from the pool, a round trip per transaction, so that a
    caller never sees a connection a database restart broke. A process that retries its work on
    connection errors anyway (the ack bridge) goes without: the first error after a restart
    discards the whole pool, and the retry runs on a new connection.

    prepare: the hot statements run as prepared statements of the session (fsm_celery.store.
    postgres); false behind a pooler that hands each transaction another session (PgBouncer's
    transaction pooling, FSM_DATABASE_PREPARE=false), where they are sent whole each time.
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
        execution_options={PREPARE: prepare},
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


def missing_database(error: BaseException) -> str | None:
    """The database a connection was refused for not existing (the server runs), or None."""
    found = MISSING_DATABASE.search(str(getattr(error, "orig", None) or error))
    return found["name"] if found else None


def createdb_command(url: str) -> str:
    """The createdb command line that makes the URL's database on its server."""
    parts = make_url(url)
    argv = ["createdb"]
    for flag, value in (("-h", parts.host), ("-p", parts.port), ("-U", parts.username)):
        if value:
            argv += [flag, str(value)]
    return shlex.join([*argv, parts.database or ""])


def create_database(url: str) -> bool:
    """Create the URL's PostgreSQL database unless it exists; whether it did. CREATE DATABASE
    cannot run inside the database it makes, so it goes through the server's maintenance
    database with the same credentials."""
    target = make_url(url)
    if target.get_backend_name() != "postgresql" or not target.database:
        return False  # SQLite makes its file on the first connection
    for maintenance in MAINTENANCE_DATABASES:
        admin = create_engine(target.set(database=maintenance), isolation_level="AUTOCOMMIT")
        try:
            return _create_database(admin, target)
        except exc.OperationalError as error:
            if missing_database(error) != maintenance or maintenance == MAINTENANCE_DATABASES[-1]:
                raise
        finally:
            admin.dispose()
    return False  # unreachable: the last maintenance database raises


def _create_database(admin: Engine, target: URL) -> bool:
    name = str(target.database)
    with admin.connect() as conn:
        found = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name})
        if found.first() is not None:
            return False
        quoted = conn.dialect.identifier_preparer.quote_identifier(name)  # any name, safely
        try:
            conn.exec_driver_sql(f"CREATE DATABASE {quoted}")
        except exc.DBAPIError as error:
            if getattr(error.orig, "pgcode", None) == DUPLICATE_DATABASE:
                return False  # made meanwhile by another
            reason = str(error.orig).strip().splitlines()[0]
            owner = ["-O", target.username] if target.username else []
            raise DatabaseNotCreated(
                f"cannot create database {name}: {reason}; ask an administrator of the server "
                f"to run {shlex.join(['createdb', *owner, name])}"
            ) from error
    return True
