"""Acceptance under faults: a killed worker or bridge, a flushed Redis (a restarted PostgreSQL:
test_postgres_restart.py, a file of its own so that the suite's processes share the time).
Nothing is lost, nothing is applied twice, and every machine reaches its end."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from fsm_celery.core.messages import ack_stream
from tests.support.agents import ScriptedAgent
from tests.support.faults import (
    assert_each_finished_exactly_once,
    start_many,
    wait_for_progress,
    wait_settled,
)
from tests.support.processes import FsmEnv

# The machines in flight when a worker or the bridge is killed: by then every one's first task
# and a third of their second ones sent, the rest in the queues, the bridge's batches and the
# agent's answers. 150 leave both mid-flight as 300 did (the worker runs 4 tasks at a time, the
# bridge reads up to 500 at once), in half the time on a loaded box, where the 300's last
# machines came near their states' deadlines.
UNDER_LOAD = 150


@pytest.fixture(scope="module")
def faulty(env_factory: Callable[..., FsmEnv], mode: str) -> Iterator[FsmEnv]:
    """A deployment of its own: workers with beat sending the scan every second."""
    env = env_factory(f"faulty_{mode}", transition_mode=mode, stream_claim_idle_seconds=1.0)
    env.start_bridge(processes=2)
    yield env
    env.stop_all()


def test_sigkill_of_the_worker_under_load_loses_and_doubles_nothing(faulty: FsmEnv) -> None:
    worker = faulty.start_worker(beat=True)
    with ScriptedAgent(faulty) as agent:
        ids = start_many(faulty, agent, UNDER_LOAD)
        wait_for_progress(agent, UNDER_LOAD + UNDER_LOAD // 3)
        worker.kill()
        faulty.start_worker(beat=True)
        infos = [faulty.wait_until_done(mid, timeout=120) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    assert_each_finished_exactly_once(faulty, ids)


def test_flushall_mid_flight_is_repaired_by_the_scan(faulty: FsmEnv) -> None:
    faulty.ensure_worker(beat=True)
    with ScriptedAgent(faulty) as agent:
        ids = start_many(faulty, agent, 100)
        wait_for_progress(agent, 120)
        faulty.redis.flushall()
        infos = [faulty.wait_until_done(mid, timeout=120) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    assert_each_finished_exactly_once(faulty, ids)


def test_sigkill_of_the_bridge_under_load_loses_and_doubles_no_ack(faulty: FsmEnv) -> None:
    faulty.ensure_worker(beat=True)
    with ScriptedAgent(faulty, via_stream=True) as agent:
        ids = start_many(faulty, agent, UNDER_LOAD)
        wait_for_progress(agent, UNDER_LOAD + UNDER_LOAD // 3)
        for proc in faulty.procs:
            if proc.name == "bridge":
                proc.kill()  # both processes, mid-batch: read, perhaps applied, not XACKed
        faulty.start_bridge(processes=2)
        infos = [faulty.wait_until_done(mid, timeout=120) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    assert_each_finished_exactly_once(faulty, ids)
    wait_settled(faulty, ack_stream(faulty.settings.channel_prefix))  # every entry dealt with
