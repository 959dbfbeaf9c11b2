"""Acceptance: no single message holds back another. Each poison message goes through Redis to
a real worker and bridge; it is refused, or fails its own machine's attempt, with the reason
recorded; the machines around it complete; and no state_task is sent twice for one attempt."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import ONE_MODE
from tests.support.agents import ScriptedAgent
from tests.support.databases import records_refused
from tests.support.messages import SILENT, Reply, ack_for, dispatches
from tests.support.processes import FsmEnv

Task = dict[str, Any]
BYSTANDERS = 4  # machines of another agent in flight while the poison arrives
CONTEXT_LIMIT = 20_000


@pytest.fixture(scope="module")
def poison(env_factory: Callable[..., FsmEnv], mode: str) -> Iterator[FsmEnv]:
    env = env_factory(
        f"poison_{mode}", transition_mode=mode, max_context_bytes=CONTEXT_LIMIT, max_handbacks=2
    )
    env.start_worker()
    env.start_bridge()
    yield env
    env.stop_all()


def _raw(message: Task, **raw_values: str) -> str:
    """The message as JSON, with output values written as raw JSON text (NaN, 1e400, ...)."""
    marked = {**message, "output": {**message["output"], **{k: f"@{k}@" for k in raw_values}}}
    text = json.dumps(marked)
    for key, raw in raw_values.items():
        text = text.replace(f'"@{key}@"', raw)
    return text


def _status(concurrency: int) -> Callable[[Task, str], str]:
    def build(_task: Task, agent_id: str) -> str:
        return json.dumps(
            {
                "type": "agent_status",
                "agentId": agent_id,
                "agentType": "tester",
                "status": "active",
                "concurrency": concurrency,
            }
        )

    return build


def _ack(**raw_values: str) -> Callable[[Task, str], str]:
    return lambda task, _agent: _raw(ack_for(task), **raw_values)


def _field(**fields: Any) -> Callable[[Task, str], str]:
    return lambda task, _agent: json.dumps({**ack_for(task), **fields})


def _output(**output: Any) -> Callable[[Task, str], str]:
    return lambda task, _agent: json.dumps({**ack_for(task), "output": {"first": 1, **output}})


@dataclass(frozen=True)
class Poison:
    """A message answering the machine's first task, and the reason it must be refused with."""

    build: Callable[[Task, str], str]
    reason: str
    about_machine: bool = True  # recorded against the machine (not for an agent status)


POISONS: dict[str, Poison] = {
    "attempt 2**31": Poison(_field(attempt=2**31), "schema_violation"),
    "attempt 2**40": Poison(_field(attempt=2**40), "schema_violation"),
    "attempt 2**63": Poison(_field(attempt=2**63), "schema_violation"),
    "state longer than its column": Poison(_field(state="S" * 51), "schema_violation"),
    "status with concurrency 2**40": Poison(_status(2**40), "schema_violation", False),
    "NaN in the output": Poison(_ack(ratio="NaN"), "invalid_value"),
    "Infinity in the output": Poison(_ack(ratio="Infinity"), "invalid_value"),
    "1e400 in the output": Poison(_ack(ratio="1e400"), "invalid_value"),
    "tokensUsed past bigint": Poison(_ack(tokensUsed=str(2**63)), "invalid_value"),
    "cost Infinity": Poison(_ack(cost="Infinity"), "invalid_value"),
    "NUL in the output": Poison(_output(log="build\u0000failed"), "invalid_value"),
    "output past the context limit": Poison(_output(blob="x" * CONTEXT_LIMIT), "invalid_output"),
    # Past the limit by less than an entry's field names may add: read, and refused. Further
    # past, it never leaves Redis (test_oversized.py).
    "a message past the limit": Poison(_output(blob="x" * 2**20), "oversized", False),
}


def _assert_sent_once(env: FsmEnv, *agents: str) -> None:
    for agent in agents:
        twice = {key: n for key, n in dispatches(env, agent).items() if n > 1}
        assert twice == {}, f"state_tasks sent more than once: {twice}"


def _finish(env: FsmEnv, ids: list[uuid.UUID], status: str = "completed") -> None:
    for mid in ids:
        assert env.wait_until_done(mid, timeout=60).status == status, env.client.history(mid)


@pytest.mark.parametrize("name", list(POISONS))
def test_a_poison_message_is_refused_and_holds_back_no_one(poison: FsmEnv, name: str) -> None:
    case = POISONS[name]
    with (
        ScriptedAgent(poison, {"FIRST": [SILENT]}, own_stream=True) as agent,
        ScriptedAgent(poison, own_stream=True) as bystander,
    ):
        others = [
            poison.client.start_machine("test_pair", {}, agent_id=bystander.id)
            for _ in range(BYSTANDERS)
        ]
        mid = poison.client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        before = len(poison.client.rejected(None, limit=10_000))
        agent.send(case.build(task, agent.id))
        found = _wait_for_new_rejection(poison, before)
        assert found["reason"] == case.reason, found
        assert (found["machine_id"] == str(mid)) is case.about_machine, found
        if case.reason != "invalid_output":  # that one failed the attempt; the retry follows
            agent.send(ack_for(task))
        _finish(poison, [mid, *others])
        _assert_sent_once(poison, agent.id, bystander.id)


def _wait_for_new_rejection(env: FsmEnv, before: int) -> dict[str, Any]:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        found = env.client.rejected(None, limit=10_000)
        if len(found) > before:
            return found[0]
        time.sleep(0.05)
    raise AssertionError("the poison message was not recorded as rejected")


@pytest.mark.parametrize(
    ("context", "error"),
    [
        ({"divisor": 0, "width": 1}, "ZeroDivisionError"),
        ({"divisor": "ten", "width": 1}, "TypeError"),
        ({"divisor": 1, "width": 10**8}, "a repetition would build 100,000,000 items"),
    ],
    ids=["zero-division", "type-error", "prompt-too-large"],
)
def test_a_prompt_that_cannot_render_fails_only_its_machine(
    poison: FsmEnv, context: dict[str, Any], error: str
) -> None:
    with ScriptedAgent(poison, own_stream=True) as agent:
        others = [
            poison.client.start_machine("test_pair", {}, agent_id=agent.id)
            for _ in range(BYSTANDERS)
        ]
        mid = poison.client.start_machine("test_poison", context, agent_id=agent.id)
        _finish(poison, [mid], "failed")
        _finish(poison, others)
        history = poison.client.history(mid)
        assert [(r.event, r.to_state) for r in history] == [
            ("start", "FIRST"),
            ("dispatch_error", "FIRST"),  # failed where it is, its failure edge not taken
        ]
        assert error in (history[-1].error_message or "")
        assert str(mid) not in {task["machineId"] for task in agent.tasks}
        _assert_sent_once(poison, agent.id)


STRICT_PROMPT = """
type: test_strict_prompt
agent_type: tester
initial_state: FIRST
states:  # no context_schema: only the render can tell what the context lacks
  - {name: FIRST, prompt: "Research {{ topic }}.", on_success: DONE, on_failure: REPORT}
  - {name: REPORT, prompt: "Report.", on_success: DONE, on_failure: FAILED}
  - {name: DONE, terminal: completed}
  - {name: FAILED, terminal: failed}
"""


def test_a_prompt_naming_a_key_the_context_lacks_fails_its_machine_and_reaches_no_agent(
    poison: FsmEnv, tmp_path: Path
) -> None:
    (tmp_path / "strict.yaml").write_text(STRICT_PROMPT)
    poison.client.load_definitions(str(tmp_path))
    with ScriptedAgent(poison, own_stream=True) as agent:
        mid = poison.client.start_machine("test_strict_prompt", {"query": "x"}, agent_id=agent.id)
        machine = poison.wait_until_done(mid)
        bystander = poison.client.start_machine("test_pair", {}, agent_id=agent.id)
        _finish(poison, [bystander])  # the agent was there, and was sent the other's tasks
    assert (machine.status, machine.current_state) == ("failed", "FIRST")
    assert machine.error == "not dispatched: prompt of FIRST: 'topic' is undefined"
    history = poison.client.history(mid)
    assert [(r.event, r.to_state) for r in history] == [
        ("start", "FIRST"),
        ("dispatch_error", "FIRST"),  # its failure edge, to REPORT, not taken
    ]
    assert history[-1].error_message == machine.error
    assert str(mid) not in {task["machineId"] for task in agent.tasks}
    assert str(bystander) in {task["machineId"] for task in agent.tasks}


@ONE_MODE
def test_a_context_key_named_self_changes_nothing(poison: FsmEnv) -> None:
    script = {"FIRST": [Reply(output={"self": 2})], "SECOND": [Reply(output={"n": 5})]}
    with ScriptedAgent(poison, script, own_stream=True) as agent:
        context = {"self": 1, "divisor": 4, "width": 2}  # started with it, given it again below
        started = poison.client.start_machine("test_poison", context, agent_id=agent.id)
        _finish(poison, [started])
        assert poison.client.get_machine(started).context["self"] == 2


@ONE_MODE
def test_a_guard_that_raises_on_the_output_fails_the_attempt(poison: FsmEnv) -> None:
    script = {"FIRST": [Reply(output={})], "SECOND": [Reply(output={"n": "many"})]}
    with ScriptedAgent(poison, script, own_stream=True) as agent:
        mid = poison.client.start_machine(
            "test_poison", {"divisor": 4, "width": 2}, agent_id=agent.id
        )
        _finish(poison, [mid], "failed")
        last = poison.client.history(mid)[-1]
        assert (last.from_state, last.to_state, last.success) == ("SECOND", "FAILED", False)
        assert last.error_message is not None
        assert "guard 'output.n > `3`' failed on the output: TypeError" in last.error_message
        assert [r["reason"] for r in poison.client.rejected(mid)] == ["invalid_output"]


def _hand_back(task: Task) -> dict[str, Any]:
    return {
        "type": "state_handback",
        "machineId": task["machineId"],
        "state": task["state"],
        "attempt": task["attempt"],
        "taskToken": task["taskToken"],
        "reason": "shutting down",
    }


def test_a_hand_back_sends_the_state_again_at_once_without_a_retry(poison: FsmEnv) -> None:
    with ScriptedAgent(poison, {"FIRST": [SILENT]}, own_stream=True) as agent:
        mid = poison.client.start_machine("test_pair", {}, agent_id=agent.id)
        first = agent.wait_for_tasks(1)
        agent.send(_hand_back(first))
        again = agent.wait_for_tasks(2, timeout=5)
        assert (again["state"], again["attempt"]) == ("FIRST", first["attempt"] + 1)
        _finish(poison, [mid])
        history = poison.client.history(mid)
        assert [(r.event, r.to_state, r.error_message) for r in history[:2]] == [
            ("start", "FIRST", None),
            ("handback", "FIRST", "handed back: shutting down"),
        ]
        assert history[2].event == "ack" and history[2].error_message is None  # no retry spent
        _assert_sent_once(poison, agent.id)


@ONE_MODE
def test_hand_backs_in_a_row_past_the_limit_count_as_a_failure(poison: FsmEnv) -> None:
    with ScriptedAgent(poison, {"FIRST": [SILENT] * 3}, own_stream=True) as agent:
        mid = poison.client.start_machine("test_pair", {}, agent_id=agent.id)
        for n in (1, 2, 3):
            agent.send(_hand_back(agent.wait_for_tasks(n, timeout=5)))
        _finish(poison, [mid])
        events = [(r.event, r.error_message or "") for r in poison.client.history(mid)]
        assert [e for e, _ in events] == ["start", "handback", "handback", "handback", "ack", "ack"]
        assert events[3][1].endswith("3 times in a row, counted as a failure) (retry 1 of 3)")


@ONE_MODE
def test_heartbeats_do_not_keep_an_attempt_past_its_longest_duration(poison: FsmEnv) -> None:
    # The agent beats every 0.3 s for two minutes, each beat good for a second: only the state's
    # max_duration (3 s) can end the attempt within _finish's wait (60 s), however slow the box.
    script = {"WORK": [Reply(heartbeat_for=120.0, silent=True)]}
    with ScriptedAgent(poison, script, own_stream=True) as agent:
        mid = poison.client.start_machine("test_heartbeat_cap", {}, agent_id=agent.id)
        _finish(poison, [mid], "failed")
        last = poison.client.history(mid)[-1]
        assert (last.event, last.error_message) == ("timeout", "timed out")
        assert agent.tasks  # it was working, and saying so


def test_a_message_that_cannot_even_be_recorded_is_parked_and_the_stream_moves_on(
    poison: FsmEnv,
) -> None:
    marker = f"unrecordable-{uuid.uuid4().hex}"
    with (
        records_refused(poison.client.engine.db, marker),  # it cannot even be recorded
        ScriptedAgent(poison, {"FIRST": [SILENT]}, own_stream=True) as agent,
    ):
        mid = poison.client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        agent.send('{"broken": "' + marker)  # malformed, and its rejection fails
        agent.send(ack_for(task))  # behind it on the same stream
        _finish(poison, [mid])
        parked = _wait_for_parked(poison, marker)
        assert parked["reason"] == "could not be applied nor recorded 3 times"
        stream = f"{poison.settings.channel_prefix}stream:state:ack:{agent.id}"
        assert parked["source"] == stream
        assert poison.redis.xpending(stream, "fsm-bridge")["pending"] == 0
        shown = subprocess.run(
            [sys.executable, "-m", "fsm_celery", "rejected", "--parked"],
            env=poison.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        assert marker in shown.stdout


def _wait_for_parked(env: FsmEnv, marker: str) -> dict[str, str]:
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        for parked in env.client.parked(100):
            if marker in parked["message"]:
                return parked
        time.sleep(0.1)
    raise AssertionError("the unrecordable message was never parked")
