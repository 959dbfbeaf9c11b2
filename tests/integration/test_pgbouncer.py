"""PostgreSQL behind PgBouncer in transaction pooling mode (Debian's pgbouncer, a real
process): each transaction may run on another server session, so the hot statements, which
are prepared per session, are sent whole instead (FSM_DATABASE_PREPARE=false). Machines run
to the end through it in both transition modes, and a restart of PostgreSQL under load behind
it loses and doubles nothing. Without the setting, a statement prepared in one transaction is
not there in the next, as this shows first."""

from __future__ import annotations

import gzip
import shutil
import tempfile
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, cast
from uuid import UUID

import pytest
from sqlalchemy import exc, text

from fsm_celery.config import Settings
from fsm_celery.engine.retention import Retention
from fsm_celery.engine.runtime import Runtime
from fsm_celery.store import partitions
from fsm_celery.store.db import connect
from fsm_celery.store.postgres import _execute_prepared
from tests.support.agents import ScriptedAgent
from tests.support.databases import create_template
from tests.support.pgbouncer import PgBouncer
from tests.support.processes import FsmEnv, make_env
from tests.support.services import Postgres, Services

LINEAR = ["ONE", "TWO", "THREE", "DONE"]


@pytest.fixture
def bounced(services: Services) -> Iterator[tuple[Postgres, PgBouncer]]:
    """A PostgreSQL server of the test's own (it restarts it) and a PgBouncer before it."""
    # not tmp_path: pytest's directories are 0700 and the servers may run as `postgres`
    directory = Path(tempfile.mkdtemp(prefix="fsm-celery-pgb-"))
    server = Postgres(directory / "postgres").init().start()
    bouncer = PgBouncer.start(directory / "pgbouncer", server.url, pool_size=4)
    try:
        yield server, bouncer
    finally:
        bouncer.stop()
        server.stop()
        shutil.rmtree(directory, ignore_errors=True)


def test_a_statement_prepared_in_one_transaction_is_gone_in_the_next(
    bounced: tuple[Postgres, PgBouncer],
) -> None:
    _, bouncer = bounced
    prepared = connect(f"{bouncer.url}/postgres", pre_ping=False)
    whole = connect(f"{bouncer.url}/postgres", pre_ping=False, prepare=False)
    sql = "SELECT CAST(:n AS int) + 1"
    try:
        with prepared.connect() as a, prepared.connect() as b:
            with a.begin():
                assert _execute_prepared(a, sql, {"n": "1"}).scalar() == 2  # on session S1
            with b.begin():
                b.execute(text("SELECT 1"))  # S1 again (PgBouncer hands out the last used)
                with pytest.raises(exc.DBAPIError, match="does not exist"), a.begin():
                    _execute_prepared(a, sql, {"n": "1"})  # another session: no such statement
        with prepared.connect() as a, prepared.connect() as b, a.begin(), b.begin():
            # told once: the engine sends its statements whole from then on (the caller of a
            # failed transaction tries it again: a connection error, to SQLAlchemy)
            assert _execute_prepared(a, sql, {"n": "2"}).scalar() == 3
            assert _execute_prepared(b, sql, {"n": "3"}).scalar() == 4
        with whole.connect() as a, whole.connect() as b, a.begin(), b.begin():
            assert _execute_prepared(a, sql, {"n": "41"}).scalar() == 42
            assert _execute_prepared(b, sql, {"n": "1"}).scalar() == 2
    finally:
        prepared.dispose()
        whole.dispose()


@pytest.fixture
def deployment(
    bounced: tuple[Postgres, PgBouncer], services: Services, mode: str
) -> Iterator[tuple[FsmEnv, Postgres]]:
    server, bouncer = bounced
    create_template(server.url, "template_fsm")  # migrated directly, not through PgBouncer
    env = make_env(
        f"pgbouncer_{mode}",
        bouncer.url,
        "template_fsm",
        services.redis_url,
        transition_mode=mode,
        database_prepare=False,
        stream_claim_idle_seconds=1.0,
    )
    env.start_bridge()
    try:
        yield env, server
    finally:
        env.stop_all()
        env.client.engine.db.dispose()


def test_machines_run_through_pgbouncer_and_ride_out_a_postgres_restart(
    deployment: tuple[FsmEnv, Postgres],
) -> None:
    env, server = deployment
    env.start_worker(beat=True)
    with ScriptedAgent(env) as agent:
        ids: list[UUID] = [
            env.client.start_machine("test_linear", {}, agent_id=agent.id) for _ in range(100)
        ]
        deadline = 60.0
        start = time.monotonic()
        while len(agent.tasks) < 120:
            assert time.monotonic() - start < deadline, f"only {len(agent.tasks)} tasks"
            time.sleep(0.01)
        server.restart()  # behind PgBouncer: its server connections break, its clients' do not
        infos = [env.wait_until_done(mid, timeout=120) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    for mid in ids:
        history = env.client.history(mid)
        assert [row.attempt for row in history] == list(range(len(history))), mid
        assert [row.to_state for row in history if row.success] == LINEAR, mid


def test_the_history_retention_works_through_pgbouncer_and_leaves_no_setting_behind(
    bounced: tuple[Postgres, PgBouncer], tmp_path: Path
) -> None:
    """Detaching (DETACH ... CONCURRENTLY, outside a transaction), archiving (COPY) and making
    months through a transaction pooler; nothing it sets outlives its transaction on the
    server sessions other clients get."""
    server, bouncer = bounced
    create_template(server.url, "fsm_retention")  # migrated directly, not through PgBouncer
    url = f"{bouncer.url}/fsm_retention"
    db = connect(url, pre_ping=False, prepare=False)
    old = datetime.now(UTC) - timedelta(days=400)
    settings = Settings(database_url=url, history_retention_days=30, history_archive=str(tmp_path))
    try:
        partitions.ensure(db, partitions.HISTORY, old, old)
        with db.begin() as conn:
            mid = conn.execute(
                text(
                    "INSERT INTO state_machines (id, type, agent_type, current_state, context,"
                    " status, definition_version, created_at, updated_at) VALUES"
                    " (gen_random_uuid(), 't', 'a', 'DONE', '{}', 'completed', 1, :at, :at)"
                    " RETURNING id"
                ),
                {"at": old},
            ).scalar_one()
            for attempt in (0, 1):
                conn.execute(
                    text(
                        "INSERT INTO state_transitions (machine_id, to_state, success, attempt,"
                        " event, machine_created_at) VALUES (:m, 'DONE', true, :a, 'ack', :at)"
                    ),
                    {"m": mid, "a": attempt, "at": old},
                )
            conn.execute(text("INSERT INTO rollups (name, last_id) VALUES ('history', 1000)"))
        done = Retention(Runtime(db, cast(Any, None), settings)).run()
        archived = [o for o in done if o.action == "archived"]
        assert [(o.month, o.rows) for o in archived] == [(f"{old:%Y-%m}", 2)], done
        assert not [o for o in done if o.action == "failed"], done
        with gzip.open(
            tmp_path / f"{partitions.name(partitions.HISTORY, partitions.month(old))}.csv.gz", "rt"
        ) as f:
            assert len(f.read().splitlines()) == 3  # the header and its two rows
        with db.connect() as a, db.connect() as b, db.connect() as c:  # the pool's sessions
            for conn in (a, b, c):
                assert conn.execute(text("SHOW lock_timeout")).scalar() == "0"
    finally:
        db.dispose()
