"""Alembic environment: runs against the connection or URL that fsm_celery.store.db hands in."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine

from fsm_celery.store import start_keys  # noqa: F401 (its table, declared on metadata)
from fsm_celery.store.partitions import include_name
from fsm_celery.store.tables import metadata

config = context.config


def run() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _migrate(connection)
        return
    engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
    with engine.begin() as conn:
        _migrate(conn)
    engine.dispose()


def _migrate(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=metadata,
        render_as_batch=True,  # SQLite alters tables by copying them
        compare_type=True,
        include_name=include_name,
    )
    with context.begin_transaction():
        context.run_migrations()


run()
