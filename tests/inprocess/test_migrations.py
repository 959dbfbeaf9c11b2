"""The Alembic migrations build exactly the schema the code declares, up and down."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine, inspect, text

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


@pytest.mark.parametrize("database", ["empty_postgres", "empty_sqlite"])
def test_live_machines_stored_before_0025_are_counted_by_it(
    database: str, request: pytest.FixtureRequest
) -> None:
    """0025 counts the live machines present at the upgrade into machine_counts (from then on
    its triggers count them), and its downgrade leaves 0011's counts of finished ones only."""
    db: Engine = request.getfixturevalue(database)
    config = alembic_config(str(db.url))

    def to(revision: str, step: Any) -> None:
        with db.begin() as conn:
            config.attributes["connection"] = conn
            step(config, revision)

    to("0024", command.upgrade)
    insert = (
        "INSERT INTO state_machines (id, type, agent_type, current_state, context, status,"
        " definition_version, tokens_used, cost, created_at, updated_at)"
        " VALUES (:id, 't', 'a', 'S', '{}', :status, 1, :tokens, 0.5, :at, :at)"
    )
    at = datetime.now(UTC)
    with db.begin() as conn:
        for status, tokens in (("running", 3), ("running", 4), ("paused", 5), ("completed", 6)):
            row = {"id": uuid.uuid4().hex if database == "empty_sqlite" else uuid.uuid4()}
            conn.execute(text(insert), {**row, "status": status, "tokens": tokens, "at": at})
    counted = "SELECT status, sum(machines), sum(tokens) FROM {} GROUP BY status ORDER BY status"

    def counts() -> dict[str, tuple[int, int]]:
        with db.connect() as conn:
            found: dict[str, tuple[int, int]] = {}
            for table in ("machine_counts", "machine_count_changes"):
                for status, n, tokens in conn.execute(text(counted.format(table))):
                    was = found.get(status, (0, 0))
                    found[status] = (was[0] + int(n), was[1] + int(tokens))
            return {k: v for k, v in found.items() if v != (0, 0)}

    assert counts() == {"completed": (1, 6)}  # 0011 counts the finished ones only
    to("head", command.upgrade)
    assert counts() == {"completed": (1, 6), "paused": (1, 5), "running": (2, 7)}
    to("0024", command.downgrade)
    assert counts() == {"completed": (1, 6)}
