"""Acceptance: killing the worker (and the bridge) and starting new ones resumes every running
machine."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator

import pytest

from fsm_celery.client import Client
from fsm_celery.engine import Step
from tests.support.agents import ScriptedAgent
from tests.support.processes import FsmEnv


@pytest.fixture(scope="module")
def crashy(env_factory: Callable[..., FsmEnv], mode: str) -> Iterator[FsmEnv]:
    """A deployment of its own, whose workers run beat (the scan every second)."""
    env = env_factory(f"crashy_{mode}", transition_mode=mode)
    env.start_bridge()
    yield env
    env.stop_all()


def _assert_one_history_row_per_attempt(env: FsmEnv, machine_ids: list) -> None:
    for mid in machine_ids:
        attempts = [row.attempt for row in env.client.history(mid)]
        assert attempts == list(range(len(attempts))), f"machine {mid}: attempts {attempts}"


def test_machines_waiting_on_agents_resume_when_worker_and_bridge_restart(crashy: FsmEnv) -> None:
    worker = crashy.start_worker(beat=True)
    gate = threading.Event()
    with ScriptedAgent(crashy, gate=gate, via_stream=True) as agent:
        ids = [
            crashy.client.start_machine(
                "cto_fix_bug", {"projectName": "p", "githubIssue": i + 1}, agent_id=agent.id
            )
            for i in range(10)
        ]
        for mid in ids:
            crashy.wait_for_state(mid, "ANALYZE_BUG")
        deadline = time.monotonic() + 15
        while len(agent.tasks) < 10:
            assert time.monotonic() < deadline, "not every machine was dispatched"
            time.sleep(0.05)
        worker.kill()
        for proc in crashy.procs:
            if proc.name == "bridge":
                proc.kill()
        gate.set()  # the agent answers while neither runs: the acks wait in the stream
        time.sleep(1)
        assert all(crashy.client.get_machine(m).current_state == "ANALYZE_BUG" for m in ids)
        crashy.start_bridge()
        crashy.start_worker(beat=True)
        infos = [crashy.wait_until_done(mid, timeout=60) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    _assert_one_history_row_per_attempt(crashy, ids)


def test_worker_killed_mid_flight_then_replaced_finishes_every_machine(crashy: FsmEnv) -> None:
    worker = crashy.start_worker(beat=True)
    with ScriptedAgent(crashy) as agent:
        ids = [crashy.client.start_machine("test_linear", {}, agent_id=agent.id) for _ in range(40)]
        deadline = time.monotonic() + 15
        while len(agent.tasks) < 30:
            assert time.monotonic() < deadline, "machines did not start moving"
            time.sleep(0.01)
        worker.kill()  # SIGKILL the whole worker: tasks in flight are lost with it
        crashy.start_worker(beat=True)
        infos = [crashy.wait_until_done(mid, timeout=90) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    for mid in ids:
        assert crashy.visited(mid)[-1] == "DONE"
    _assert_one_history_row_per_attempt(crashy, ids)


def test_machine_started_while_the_broker_is_down_is_dispatched_by_the_scan(
    crashy: FsmEnv,
) -> None:
    crashy.ensure_worker(beat=True)

    def broker_down(steps: list[Step]) -> None:
        raise ConnectionError("broker unreachable")

    client = Client(crashy.client.engine, broker_down)
    with ScriptedAgent(crashy) as agent:
        mid = client.start_machine("test_linear", {}, agent_id=agent.id)
        info = crashy.wait_until_done(mid, timeout=30)
    assert info.status == "completed"
    assert crashy.visited(mid) == ["ONE", "TWO", "THREE", "DONE"]
