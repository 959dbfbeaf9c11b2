"""The Alembic migrations build exactly the schema the code declares, up and down."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect

from fsm_celery.store.db import alembic_config, connect, current_revision, upgrade
from fsm_celery.store.partitions import include_name
from fsm_celery.store.tables import metadata
from tests.support.databases import admin_sql, drop_database
from tests.support.services import Services


@pytest.fixture
def empty_postgres(services: Services, template_db: str) -> Iterator[Engine]:
    name = f"fsm_test_migrations_{template_db.rsplit('_', 1)[-1]}"
    drop_database(services.pg_url, name)
    admin_sql(services.pg_url, f'CREATE DATABASE "{name}"')
    db = connect(f"{services.pg_url}/{name}")
    yield db
    db.dispose()
    drop_database(services.pg_url, name)


@pytest.fixture
def empty_sqlite(tmp_path: Path) -> Iterator[Engine]:
    db = connect(f"sqlite:///{tmp_path / 'fsm.sqlite3'}")
    yield db
    db.dispose()


@pytest.mark.parametrize("database", ["empty_postgres", "empty_sqlite"])
def test_upgrade_builds_exactly_the_declared_schema(
    database: str, request: pytest.FixtureRequest
) -> None:
    db: Engine = request.getfixturevalue(database)
    upgrade(db)
    with db.connect() as conn:
        context = MigrationContext.configure(conn, opts={"include_name": include_name})
        assert compare_metadata(context, metadata) == []
    head = ScriptDirectory.from_config(alembic_config(str(db.url))).get_current_head()
    assert current_revision(db) == head


@pytest.mark.parametrize("database", ["empty_postgres", "empty_sqlite"])
def test_downgrade_to_base_and_up_again(database: str, request: pytest.FixtureRequest) -> None:
    db: Engine = request.getfixturevalue(database)
    upgrade(db)
    config = alembic_config(str(db.url))
    with db.begin() as conn:
        config.attributes["connection"] = conn
        command.downgrade(config, "base")
    assert set(inspect(db).get_table_names()) <= {"alembic_version"}
    upgrade(db)
    assert {
        "state_machines",
        "state_transitions",
        "state_machine_definitions",
        "rejected_messages",
    } <= set(inspect(db).get_table_names())
