"""Flower, as a real process beside a real worker and bridge: the transition path's tasks are
readable there, searchable by machine id, and nobody reads them without credentials."""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select

from fsm_celery.agent.mock import OUTPUTS
from fsm_celery.agent.sdk import Agent, Task
from fsm_celery.store.tables import liveness
from tests.support import ROOT
from tests.support.agents import ScriptedAgent, serving
from tests.support.processes import FsmEnv

AUTH = "operator:flower-test-password"
INFRA_STATES = ["CHECK_UPTIME", "CHECK_CERTS", "CHECK_CONTAINERS", "GENERATE_REPORT"]
HOUSEKEEPING = {
    "fsm.scan",
    "fsm.run_schedules",
    "fsm.fold_stats",
    "fsm.notify",
    "fsm.prune",
    "fsm.history",
}


@pytest.fixture(scope="module")
def flower(env_factory: Callable[..., FsmEnv]) -> Iterator[tuple[FsmEnv, int]]:
    """A celery-mode deployment watched by Flower (started first: it sees events from then)."""
    env = env_factory("flower", transition_mode="celery")
    _, port = env.start_flower(basic_auth=AUTH)
    env.start_worker()
    env.start_bridge()
    yield env, port


def get(port: int, path: str, auth: str | None = AUTH) -> Any:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    if auth is not None:
        request.add_header("Authorization", "Basic " + base64.b64encode(auth.encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def tasks_of(port: int, machine_id: str, name: str, expected: int) -> list[dict[str, Any]]:
    """The tasks of that name Flower's search finds for the machine, once it has `expected`
    succeeded ones (the events reach Flower a moment after the tasks ran)."""
    deadline = time.monotonic() + 20
    while True:
        found = get(port, f"/api/tasks?taskname={name}&search={machine_id}")
        done = [t for t in found.values() if t["state"] == "SUCCESS"]
        if len(done) >= expected or time.monotonic() > deadline:
            return done
        time.sleep(0.2)


def test_flower_shows_one_enter_state_per_state_visited(flower: tuple[FsmEnv, int]) -> None:
    env, port = flower
    with ScriptedAgent(env) as agent:
        mid = env.client.start_machine("cto_infrastructure_check", {}, agent_id=agent.id)
        assert env.wait_until_done(mid).status == "completed"
    assert env.visited(mid) == [*INFRA_STATES, "COMPLETE"]  # COMPLETE is final: no task

    entered = tasks_of(port, str(mid), "fsm.enter_state", len(INFRA_STATES))
    states = Counter(t["args"].split("state=")[1].split()[0] for t in entered)
    assert states == Counter(INFRA_STATES)
    for task in entered:
        assert task["args"].startswith(f"cto_infrastructure_check {mid} state=")
        assert " attempt=" in task["args"]

    # The acks that moved it are in fsm.apply_acks tasks, which the same search finds.
    relayed = tasks_of(port, str(mid), "fsm.apply_acks", 1)
    assert relayed and all(str(mid) in t["args"] for t in relayed)


def test_flower_lists_the_machines_tasks_not_the_engines_housekeeping(
    flower: tuple[FsmEnv, int],
) -> None:
    env, port = flower
    with ScriptedAgent(env) as agent:
        started = time.monotonic()
        mid = env.client.start_machine("cto_infrastructure_check", {}, agent_id=agent.id)
        env.wait_until_done(mid)
        time.sleep(max(0.0, 6 - (time.monotonic() - started)))  # 6 s of beat's every-second work
    scans = _last_scan(env)
    assert scans is not None and time.time() - scans < 3  # the worker ran beat's scan meanwhile
    listed = Counter(t["name"] for t in get(port, "/api/tasks?limit=10000").values())
    assert listed["fsm.enter_state"] >= len(INFRA_STATES), listed
    assert not HOUSEKEEPING & set(listed), listed  # ~30 scan/schedules/notify before


def test_flower_lists_no_task_for_agents_statuses(flower: tuple[FsmEnv, int]) -> None:
    env, port = flower
    agent = Agent(
        "cto",
        redis_url=env.settings.redis_url,
        prefix=env.settings.channel_prefix,
        status_interval=0.2,  # a report every 0.2 s: each was a task of its own
    )

    @agent.handler()
    def answer(task: Task) -> dict[str, Any]:
        return OUTPUTS[task.state]

    with serving(agent):
        first = _last_seen(env, agent.id)
        mid = env.client.start_machine("cto_infrastructure_check", {}, agent_id=agent.id)
        assert env.wait_until_done(mid).status == "completed"
        _wait_until(lambda: _last_seen(env, agent.id) > first)  # its reports are applied
    assert tasks_of(port, str(mid), "fsm.apply_acks", 1)  # Flower has the machine's acks
    relayed = get(port, "/api/tasks?taskname=fsm.apply_acks&limit=10000").values()
    assert [t["args"] for t in relayed if "agent_status" in t["args"]] == []


def _last_seen(env: FsmEnv, agent_id: str) -> str:
    """When the agent's latest status was applied (once it was)."""
    _wait_until(lambda: any(a["id"] == agent_id for a in env.client.agents()))
    [found] = [a for a in env.client.agents() if a["id"] == agent_id]
    return str(found["last_seen_at"])


def _wait_until(condition: Callable[[], bool], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within 20 s"
        time.sleep(0.1)


def test_flowers_task_list_shows_what_each_task_is_for(flower: tuple[FsmEnv, int]) -> None:
    env, port = flower
    with ScriptedAgent(env) as agent:
        mid = env.client.start_machine("cto_infrastructure_check", {}, agent_id=agent.id)
        env.wait_until_done(mid)
    tasks_of(port, str(mid), "fsm.enter_state", len(INFRA_STATES))  # Flower has them all
    page = _page(port, "/tasks")
    assert '<th data-column="args">' in page  # the list view's own column, by default
    query = (
        "/tasks/datatable?draw=1&start=0&length=100&order[0][column]=0&order[0][dir]=asc"
        f"&columns[0][data]=received&search[value]={mid}"
    )
    rows = get(port, query)["data"]
    labels = sorted(r["args"] for r in rows if r["name"] == "fsm.enter_state")
    assert len(labels) == len(INFRA_STATES)
    assert all(label.startswith(f"cto_infrastructure_check {mid} state=") for label in labels)


def _page(port: int, path: str) -> str:
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}")
    request.add_header("Authorization", "Basic " + base64.b64encode(AUTH.encode()).decode())
    with urllib.request.urlopen(request, timeout=10) as response:
        return str(response.read().decode())


def _last_scan(env: FsmEnv) -> float | None:
    with env.client.engine.db.connect() as conn:
        at = conn.execute(select(liveness.c.at).where(liveness.c.name == "scan")).scalar()
    return None if at is None else at.timestamp()


def test_flower_answers_401_without_credentials(flower: tuple[FsmEnv, int]) -> None:
    _, port = flower
    assert isinstance(get(port, "/api/workers"), dict)
    for auth in (None, "operator:wrong-password"):
        with pytest.raises(urllib.error.HTTPError) as refused:
            get(port, "/api/tasks", auth=auth)
        refused.value.close()
        assert refused.value.code == 401


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ([], "Flower needs credentials: set FLOWER_BASIC_AUTH"),
        (["--unauthenticated", "--address=0.0.0.0"], "serves on 127.0.0.1 only"),
        (["--basic_auth=operator:"], "must be user:password"),
    ],
)
def test_flower_refuses_to_serve_without_authentication(
    flower: tuple[FsmEnv, int], args: list[str], says: str
) -> None:
    env, _ = flower
    environ = {k: v for k, v in env.env.items() if not k.startswith("FLOWER_")}
    argv = [sys.executable, "-m", "celery", "-A", "fsm_celery", "flower", "--port=1", *args]
    done = subprocess.run(argv, cwd=ROOT, env=environ, capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert says in done.stderr
