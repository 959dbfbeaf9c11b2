"""Acceptance under faults: a restarted PostgreSQL (the other faults: test_faults.py). Nothing is
lost, nothing is applied twice, and every machine reaches its end."""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.agents import ScriptedAgent
from tests.support.databases import create_template
from tests.support.faults import assert_each_finished_exactly_once, start_many, wait_for_progress
from tests.support.processes import FsmEnv, make_env
from tests.support.services import Postgres, Services


@pytest.fixture
def own_postgres(services: Services, mode: str) -> Iterator[tuple[FsmEnv, Postgres]]:
    """A deployment on a PostgreSQL server of the test's own, which it restarts."""
    # not tmp_path: pytest's directories are 0700 and the server may run as `postgres`
    directory = Path(tempfile.mkdtemp(prefix="fsm-celery-pg-"))
    server = Postgres(directory / "postgres").init().start()
    create_template(server.url, "template_fsm")
    env = make_env(
        f"pg_restart_{mode}",
        server.url,
        "template_fsm",
        services.redis_url,
        transition_mode=mode,
        stream_claim_idle_seconds=1.0,
    )
    env.start_bridge(processes=2)
    yield env, server
    env.stop_all()
    env.client.engine.db.dispose()
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)


def test_postgres_restart_mid_flight_loses_and_doubles_nothing(
    own_postgres: tuple[FsmEnv, Postgres],
) -> None:
    env, server = own_postgres
    env.start_worker(beat=True)
    with ScriptedAgent(env) as agent:
        ids = start_many(env, agent, 100)
        wait_for_progress(agent, 120)
        server.restart()
        infos = [env.wait_until_done(mid, timeout=120) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    assert_each_finished_exactly_once(env, ids)
