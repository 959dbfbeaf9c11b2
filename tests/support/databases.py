"""The suite's databases: a migrated template per test process, and a copy of it per
deployment, made and dropped on the suite's PostgreSQL server."""

from __future__ import annotations

from sqlalchemy import create_engine, text

from fsm_celery.store.db import connect, upgrade


def admin_sql(pg_url: str, statement: str) -> None:
    engine = create_engine(f"{pg_url}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(statement))
    engine.dispose()


def create_template(pg_url: str, name: str) -> None:
    """A migrated database to copy for each environment."""
    drop_database(pg_url, name)
    admin_sql(pg_url, f'CREATE DATABASE "{name}"')
    db = connect(f"{pg_url}/{name}")
    upgrade(db)
    db.dispose()


def copy_database(pg_url: str, template: str, name: str) -> str:
    drop_database(pg_url, name)
    admin_sql(pg_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return f"{pg_url}/{name}"


def drop_database(pg_url: str, name: str) -> None:
    admin_sql(pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
