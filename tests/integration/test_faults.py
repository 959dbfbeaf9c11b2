"""Acceptance under faults: a killed worker or bridge, a flushed Redis, a restarted PostgreSQL.
Nothing is lost, nothing is applied twice, and every machine reaches its end."""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import UUID

import pytest

from fsm_celery.acks.streams import GROUP
from fsm_celery.core.messages import ack_stream
from tests.support.agents import ScriptedAgent
from tests.support.databases import create_template
from tests.support.processes import FsmEnv, make_env
from tests.support.services import Postgres, Services

LINEAR = ["ONE", "TWO", "THREE", "DONE"]


@pytest.fixture(scope="module")
def faulty(env_factory: Callable[..., FsmEnv], mode: str) -> Iterator[FsmEnv]:
    """A deployment of its own: workers with beat sending the scan every second."""
    env = env_factory(f"faulty_{mode}", transition_mode=mode, stream_claim_idle_seconds=1.0)
    env.start_bridge(processes=2)
    yield env
    env.stop_all()


def _start_many(env: FsmEnv, agent: ScriptedAgent, n: int) -> list[UUID]:
    return [env.client.start_machine("test_linear", {}, agent_id=agent.id) for _ in range(n)]


def _transitions(env: FsmEnv) -> int:
    return sum(sum(s.values()) for s in env.client.stats()["machines"].values())


def _wait_for_progress(agent: ScriptedAgent, tasks: int) -> None:
    deadline = time.monotonic() + 60
    while len(agent.tasks) < tasks:
        assert time.monotonic() < deadline, f"only {len(agent.tasks)} tasks dispatched"
        time.sleep(0.01)


def _assert_each_finished_exactly_once(env: FsmEnv, ids: list[UUID]) -> None:
    for mid in ids:
        history = env.client.history(mid)
        assert [row.attempt for row in history] == list(range(len(history))), mid
        moved = [row.to_state for row in history if row.success]
        assert moved == LINEAR, f"{mid}: successful transitions {moved}"
        assert all(row.event in ("start", "ack", "timeout") for row in history)


def test_sigkill_of_the_worker_under_load_loses_and_doubles_nothing(faulty: FsmEnv) -> None:
    worker = faulty.start_worker(beat=True)
    with ScriptedAgent(faulty) as agent:
        ids = _start_many(faulty, agent, 300)
        _wait_for_progress(agent, 400)
        worker.kill()
        faulty.start_worker(beat=True)
        infos = [faulty.wait_until_done(mid, timeout=120) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    _assert_each_finished_exactly_once(faulty, ids)


def test_flushall_mid_flight_is_repaired_by_the_scan(faulty: FsmEnv) -> None:
    faulty.ensure_worker(beat=True)
    with ScriptedAgent(faulty) as agent:
        ids = _start_many(faulty, agent, 100)
        _wait_for_progress(agent, 120)
        faulty.redis.flushall()
        infos = [faulty.wait_until_done(mid, timeout=120) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    _assert_each_finished_exactly_once(faulty, ids)


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
        ids = _start_many(env, agent, 100)
        _wait_for_progress(agent, 120)
        server.restart()
        infos = [env.wait_until_done(mid, timeout=120) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    _assert_each_finished_exactly_once(env, ids)


def test_sigkill_of_the_bridge_under_load_loses_and_doubles_no_ack(faulty: FsmEnv) -> None:
    faulty.ensure_worker(beat=True)
    with ScriptedAgent(faulty, via_stream=True) as agent:
        ids = _start_many(faulty, agent, 300)
        _wait_for_progress(agent, 400)
        for proc in faulty.procs:
            if proc.name == "bridge":
                proc.kill()  # both processes, mid-batch: read, perhaps applied, not XACKed
        faulty.start_bridge(processes=2)
        infos = [faulty.wait_until_done(mid, timeout=120) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    _assert_each_finished_exactly_once(faulty, ids)
    stream = ack_stream(faulty.settings.channel_prefix)
    assert faulty.redis.xpending(stream, GROUP)["pending"] == 0  # every entry was dealt with
