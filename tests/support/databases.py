"""The suite's databases: a migrated template per test process, and a copy of it per
deployment, made and dropped on the suite's PostgreSQL server."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine, text

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


@contextmanager
def records_refused(db: Engine, marker: str) -> Iterator[None]:
    """While inside, PostgreSQL refuses to record any rejected message holding `marker` (a
    trigger raises): a message that can be neither applied nor recorded, which the acks side
    tries again and then parks."""
    with db.begin() as conn:
        conn.exec_driver_sql(
            "CREATE FUNCTION refuse_marked() RETURNS trigger AS $$ BEGIN "
            f"IF position('{marker}' in NEW.payload) > 0 THEN RAISE EXCEPTION 'refused'; "
            "END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
        )
        conn.exec_driver_sql(
            "CREATE TRIGGER refuse_marked BEFORE INSERT ON rejected_messages "
            "FOR EACH ROW EXECUTE FUNCTION refuse_marked()"
        )
    try:
        yield
    finally:
        with db.begin() as conn:
            conn.exec_driver_sql("DROP TRIGGER refuse_marked ON rejected_messages")
            conn.exec_driver_sql("DROP FUNCTION refuse_marked()")
