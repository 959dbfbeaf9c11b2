"""Queues per workload (FSM_QUEUES): a machine type's tasks — entering its states, applying
its acks in the celery mode — go to a queue of its own, which only the workers started with
`-Q` on it consume; the rest, and the engine's periodic work, stay where they were. Doctor
names a queue nobody consumes, the machines on it wait for a worker there, and Flower lists
the queues."""

from __future__ import annotations

import base64
import json
import time
import urllib.request
import uuid
from collections.abc import Callable
from typing import Any

from tests.support.agents import ScriptedAgent
from tests.support.doctor import by_check, run_doctor
from tests.support.processes import FsmEnv

AUTH = "operator:flower-queues-password"


def _doctor(env: FsmEnv) -> dict[str, str]:
    return by_check(run_doctor(env).stdout)


def _flower(port: int, path: str) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(AUTH.encode()).decode())
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _flower_queues(port: int) -> set[str]:
    """The queues Flower lists, once it asked the workers again (as its workers page does: it
    inspects them at its start and when asked, not on its own)."""
    _flower(port, "/api/workers?refresh=1")
    return {q["name"] for q in _flower(port, "/api/queues/length")["active_queues"]}


def test_a_machine_types_tasks_run_on_its_own_queue(env_factory: Callable[..., FsmEnv]) -> None:
    pairs = f"pairs-{uuid.uuid4().hex[:8]}"
    env = env_factory(
        "queues",
        transition_mode="celery",
        queues={"test_pair": pairs},
        dispatch_grace_seconds=600,  # the scan, which enters a state nobody entered, waits
    )
    # every deployment's workers on the suite's Redis answer Flower's inspection: under load
    # some take longer than Flower's default second
    _, flower = env.start_flower("--inspect_timeout=10000", basic_auth=AUTH)
    general = env.start_worker(beat=True)
    env.start_bridge()
    with ScriptedAgent(env) as agent:
        linear = env.client.start_machine("test_linear", {}, agent_id=agent.id)
        pair = env.client.start_machine("test_pair", {}, agent_id=agent.id)
        assert env.wait_until_done(linear).status == "completed"
        lines = _doctor(env)
        assert lines["queues"] == (
            f"✘ queues: no worker consumes {pairs} — start one: celery -A fsm_celery worker "
            f"-Q {pairs}"
        )
        time.sleep(1.0)
        assert env.client.history(pair)[-1].event == "start"  # not entered: nobody on its queue
        assert not [t for t in agent.tasks if t["machineId"] == str(pair)]
        own = env.start_worker(beat=False, queues=[pairs])
        assert env.wait_until_done(pair).status == "completed"
        assert _doctor(env)["queues"].startswith("✔ queues: each consumed")
        deadline = time.monotonic() + 60
        while pairs not in _flower_queues(flower):  # Flower lists the queues workers consume
            assert time.monotonic() < deadline, _flower_queues(flower)
            time.sleep(0.5)
        assert env.settings.queue in _flower_queues(flower)
    # only the pair's tasks can be on its queue: its first state entered, and its two acks
    # (FIRST's, SECOND's) applied there
    ran_own = own.log.read_text(errors="replace")
    assert ran_own.count("Task fsm.enter_state[") >= 2  # received, succeeded
    assert ran_own.count("Task fsm.apply_acks[") >= 4  # two acks: received, succeeded each
    assert "fsm.enter_state" in general.log.read_text(errors="replace")
