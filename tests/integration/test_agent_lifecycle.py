"""Agent processes that stop, and attempts taken away from them: a stopped agent leaves within
its grace and hands back what it holds; an attempt an operator superseded (pause, force, and a
cancel the agent missed) frees the agent's slot, and its late answer is never sent."""

from __future__ import annotations

import os
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from fsm_celery.client import Client
from tests.support.processes import FsmEnv, Proc

SCRIPT = "tests/integration/sdk_agent.py"
GRACE = 2.0


@pytest.fixture(scope="module")
def lifecycle_env(env_factory: Callable[..., FsmEnv]) -> Iterator[FsmEnv]:
    env = env_factory("lifecycle", agent_liveness_seconds=3.0)
    env.start_worker(beat=True)
    env.start_bridge()
    yield env
    env.stop_all()


@pytest.fixture
def agents(lifecycle_env: FsmEnv) -> Iterator[list[Proc]]:
    """The agent processes a test starts, stopped when it ends (none routes the next test's)."""
    started: list[Proc] = []
    yield started
    for proc in started:
        proc.stop()


class Journal:
    """What sdk_agent.py's holding handler wrote: (what, machine, attempt) lines."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def lines(self) -> list[str]:
        return self.path.read_text().splitlines() if self.path.exists() else []

    def wait_for(self, line: str, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while line not in self.lines():
            assert time.monotonic() < deadline, f"never journalled {line!r}: {self.lines()}"
            time.sleep(0.05)


def _holder(
    env: FsmEnv, agents: list[Proc], journal: Journal, seconds: float, *, asynchronous: bool = False
) -> str:
    agent_id = str(uuid.uuid4())
    extra = {
        "SDK_AGENT_HOLD": str(seconds),
        "SDK_AGENT_JOURNAL": str(journal.path),
        "SDK_AGENT_GRACE": str(GRACE),
        "SDK_AGENT_ASYNC": "1" if asynchronous else "0",
    }
    agents.append(env.start_agent(SCRIPT, "tester", agent_id, extra_env=extra))
    return agent_id


def _agent(client: Client, agent_id: str) -> dict[str, Any]:
    [found] = [a for a in client.agents() if str(a["id"]) == agent_id]
    return found


def _sent_after_drop(client: Client, mid: uuid.UUID, dropped: datetime) -> list[str]:
    """What was refused of the agent's messages for the machine's superseded attempt, once the
    agent had dropped it: any ack, and heartbeats that arrived after `dropped` (one already on
    its way when the command committed is refused, and rightly so)."""
    return [
        r["payload"]
        for r in client.rejected(mid)
        if '"state_ack"' in r["payload"] or datetime.fromisoformat(r["received_at"]) > dropped
    ]


def _wait_running(client: Client, agent_id: str, running: int, timeout: float = 10.0) -> None:
    """Until the agent reports working on `running` tasks (it reports every second)."""
    deadline = time.monotonic() + timeout
    while (found := _agent(client, agent_id))["running"] != running:
        assert time.monotonic() < deadline, f"agent reports {found['running']}, not {running}"
        time.sleep(0.05)


def test_a_stopped_agent_exits_within_its_grace_and_its_task_goes_to_another_at_once(
    lifecycle_env: FsmEnv, agents: list[Proc], tmp_path: Path
) -> None:
    env = lifecycle_env
    journal = Journal(tmp_path / "journal")
    holder_id = _holder(env, agents, journal, 600)  # a handler that would work for 10 minutes
    env.wait_for_agents(1)
    mid = env.client.start_machine("test_pair", {})  # FIRST's timeout: 300 s
    journal.wait_for(f"start {mid} 1")
    helper_id = str(uuid.uuid4())
    agents.append(env.start_agent(SCRIPT, "tester", helper_id))
    env.wait_for_agents(2)

    os.killpg(agents[0].popen.pid, signal.SIGTERM)
    # Its handler would hold the task for 600 s: exiting at all within the wait is exiting by its
    # grace (how soon is a loaded machine's figure, not the agent's).
    agents[0].popen.wait(timeout=60)
    exited = datetime.now(UTC)
    done = env.wait_until_done(mid, timeout=60)

    assert done.status == "completed"
    history = env.client.history(mid)
    assert [(h.event, h.to_state, str(h.agent_id)) for h in history[1:3]] == [
        ("handback", "FIRST", holder_id),
        ("ack", "SECOND", helper_id),
    ]
    assert history[1].error_message == "handed back: the agent is shutting down"
    assert _agent(env.client, holder_id)["status"] == "stopped"
    assert _sent_after_drop(env.client, mid, exited) == []  # nothing for the decided attempt


@pytest.mark.parametrize("asynchronous", [False, True], ids=["sync-handler", "async-handler"])
def test_a_paused_machines_attempt_frees_its_agents_slot_and_is_never_answered(
    lifecycle_env: FsmEnv, agents: list[Proc], tmp_path: Path, asynchronous: bool
) -> None:
    env = lifecycle_env
    journal = Journal(tmp_path / "journal")
    agent_id = _holder(env, agents, journal, 6, asynchronous=asynchronous)
    env.wait_for_agents(1)
    mid = env.client.start_machine("test_pair", {}, agent_id=agent_id)
    journal.wait_for(f"start {mid} 1")
    _wait_running(env.client, agent_id, 1)

    env.client.pause(mid, actor="ops", reason="look first")
    _wait_running(env.client, agent_id, 0, timeout=3.0)  # freed while the handler still holds
    dropped = datetime.now(UTC)
    if asynchronous:
        journal.wait_for(f"cancelled {mid} 1", timeout=3.0)  # the asyncio task was cancelled
    else:
        assert f"returned {mid} 1" not in journal.lines()
        journal.wait_for(f"returned {mid} 1")  # the abandoned thread ends into nothing
    time.sleep(1.0)
    assert _sent_after_drop(env.client, mid, dropped) == []  # no late ack, no heartbeat

    env.client.resume(mid, actor="ops")
    done = env.wait_until_done(mid, timeout=20)
    assert done.status == "completed"
    assert [(h.event, h.attempt) for h in env.client.history(mid)[1:3]] == [
        ("pause", 1),
        ("resume", 2),
    ]
    assert _sent_after_drop(env.client, mid, dropped) == []


def test_a_forced_machines_attempt_is_dropped_and_the_forced_state_worked_on(
    lifecycle_env: FsmEnv, agents: list[Proc], tmp_path: Path
) -> None:
    env = lifecycle_env
    journal = Journal(tmp_path / "journal")
    agent_id = _holder(env, agents, journal, 6)
    env.wait_for_agents(1)
    mid = env.client.start_machine("test_pair", {}, agent_id=agent_id)
    journal.wait_for(f"start {mid} 1")
    _wait_running(env.client, agent_id, 1)

    env.client.force(mid, actor="ops", target="SECOND", reason="skip ahead")
    done = env.wait_until_done(mid, timeout=20)  # SECOND answered while FIRST still holds
    assert f"returned {mid} 1" not in journal.lines()
    assert done.status == "completed"
    assert [(h.event, h.to_state) for h in env.client.history(mid)[1:]] == [
        ("force", "SECOND"),
        ("ack", "DONE"),
    ]
    _wait_running(env.client, agent_id, 0)
    dropped = datetime.now(UTC)
    journal.wait_for(f"returned {mid} 1")
    time.sleep(1.0)
    assert _sent_after_drop(env.client, mid, dropped) == []


def test_an_agent_that_missed_the_cancel_drops_the_attempt_when_the_next_one_arrives(
    lifecycle_env: FsmEnv, agents: list[Proc], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env = lifecycle_env
    journal = Journal(tmp_path / "journal")
    agent_id = _holder(env, agents, journal, 6)
    env.wait_for_agents(1)
    mid = env.client.start_machine("test_pair", {}, agent_id=agent_id)
    journal.wait_for(f"start {mid} 1")
    _wait_running(env.client, agent_id, 1)

    dispatcher = env.client.engine.runtime.dispatcher
    monkeypatch.setattr(dispatcher, "cancel_many", lambda messages: None)  # lost on the way
    env.client.pause(mid, actor="ops")
    env.client.resume(mid, actor="ops")  # attempt 3 reaches the agent still holding 1
    done = env.wait_until_done(mid, timeout=20)
    assert done.status == "completed"
    _wait_running(env.client, agent_id, 0)
    dropped = datetime.now(UTC)
    journal.wait_for(f"returned {mid} 1")
    time.sleep(1.0)
    assert _sent_after_drop(env.client, mid, dropped) == []  # its answer was never sent


def test_an_agent_of_one_slot_serves_its_machines_in_turn_not_one_machines_chain(
    lifecycle_env: FsmEnv, agents: list[Proc]
) -> None:
    """Two machines assigned to an agent of concurrency 1: the second's first task, left
    pending while the slot was taken, is served before the first machine's next states (which
    arrive as its slot frees), not after the first machine's whole chain."""
    agent_id = str(uuid.uuid4())
    extra = {"SDK_AGENT_CONCURRENCY": "1", "SDK_AGENT_DELAY": "0.3"}
    agents.append(lifecycle_env.start_agent(SCRIPT, "tester", agent_id, extra_env=extra))
    lifecycle_env.wait_for_agents(1)
    client = lifecycle_env.client
    first = client.start_machine("test_door", {}, agent_id=agent_id)
    second = client.start_machine("test_door", {}, agent_id=agent_id)
    for mid in (first, second):
        assert lifecycle_env.wait_until_done(mid, timeout=60).status == "completed"
    answered = sorted(
        (r.created_at, mid, r.from_state)
        for mid in (first, second)
        for r in client.history(mid)
        if r.event == "ack"
    )
    order = [(mid == first, state) for _, mid, state in answered]
    assert order.index((False, "ONE")) < order.index((True, "THREE")), order
    assert all(r.attempt == n for n, r in enumerate(client.history(first)))  # no retry, no timeout
