"""The agent SDK as a user imports and configures it: the import path docs/agents.md gives,
the deployment's settings read from the environment, the id its credentials name, and the
docs' own tests of its example agent."""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from fsm_celery.agent import Agent, Failed, NoAck, Task, run
from fsm_celery.agent.runner import user_agents
from tests.support.docs import agent_example, blocks

ISSUED = "6b0d2f4e-8d1b-4c3a-9e5f-7a6b5c4d3e2f"


def test_the_sdk_is_imported_from_fsm_celery_agent() -> None:
    from fsm_celery.agent.runner import run as run_them
    from fsm_celery.agent.sdk import Agent as SdkAgent
    from fsm_celery.agent.sdk import NoAck as SdkNoAck
    from fsm_celery.agent.sdk import Task as SdkTask

    assert (Agent, Task, NoAck, run) == (SdkAgent, SdkTask, SdkNoAck, run_them)


def test_an_agent_reads_the_deployments_settings_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("FSM_REDIS_URL", "redis://redis.internal:6380/0")
    monkeypatch.setenv("FSM_CHANNEL_PREFIX", "team1:")
    monkeypatch.setenv("FSM_REDIS_REPLICAS", "1")
    monkeypatch.setenv("FSM_REDIS_REPLICA_TIMEOUT_MS", "750")
    agent = Agent("cto")
    assert (agent.redis_url, agent.prefix, agent.replicas, agent.replica_timeout_ms) == (
        "redis://redis.internal:6380/0",
        "team1:",
        1,
        750,
    )
    given = Agent("cto", redis_url="redis://other:6379/0", prefix="", replicas=0)
    assert (given.redis_url, given.prefix, given.replicas) == ("redis://other:6379/0", "", 0)


def test_an_agents_id_is_the_one_its_credentials_were_issued_to() -> None:
    url = f"redis://fsm-agent-{ISSUED}:secret@127.0.0.1:6379/0"
    assert Agent("cto", redis_url=url).id == ISSUED
    assert Agent("cto", redis_url=url, agent_id=ISSUED.upper()).id == ISSUED
    with pytest.raises(ValueError, match=f"credentials were issued to agent {ISSUED}, not"):
        Agent("cto", redis_url=url, agent_id=str(uuid.uuid4()))
    with pytest.raises(ValueError, match="the Redis URL's user: expected an agent's UUID"):
        Agent("cto", redis_url="redis://fsm-agent-nope:secret@127.0.0.1:6379/0")
    assert uuid.UUID(Agent("cto", redis_url="redis://127.0.0.1:6379/0").id)  # a new one


def test_one_process_serves_several_agent_types(tmp_path: Path) -> None:
    example = _example(tmp_path)
    assert [a.agent_type for a in example.agents] == ["analyzer", "researcher", "reviewer"]
    assert len({a.id for a in example.agents}) == 3


def test_the_cli_runs_an_agent_or_a_list_of_agents(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    example = _example(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setitem(sys.modules, "research_agents", example)
    assert user_agents("research_agents:agents") == example.agents
    assert user_agents("research_agents:reviewer") == [example.reviewer]
    with pytest.raises(ValueError, match="is a function, not an fsm_celery Agent or a list"):
        user_agents("research_agents:review")


def test_answer_for_runs_async_handlers_and_reports_no_ack() -> None:
    agent = Agent("cto", redis_url="redis://127.0.0.1:6379/0")

    @agent.handler("m", "ASYNC")
    async def later(task: Task) -> dict[str, Any]:
        return {"state": task.state}

    @agent.handler("m", "SILENT")
    def silent(task: Task) -> dict[str, Any]:
        raise NoAck

    @agent.handler("m", "SPENT")
    def spent(task: Task) -> dict[str, Any]:
        raise Failed("the model gave up", {"tokensUsed": 120, "cost": 0.01})

    ack = agent.answer_for("m", "ASYNC")
    assert ack is not None and (ack["success"], ack["output"]) == (True, {"state": "ASYNC"})
    assert agent.answer_for("m", "SILENT") is None
    failed = agent.answer_for("m", "SPENT")  # failed, with what it spent all the same
    assert failed is not None and (failed["success"], failed["error"]) == (
        False,
        "the model gave up",
    )
    assert failed["output"] == {"tokensUsed": 120, "cost": 0.01}


def test_the_docs_tests_of_the_example_agent_pass(tmp_path: Path) -> None:
    _example(tmp_path)
    [tests] = [b for b in blocks("agents.md", "python") if "from research_agents" in b]
    found: dict[str, Any] = {}
    exec(compile(tests, "docs/agents.md", "exec"), found)  # the doc's own test module
    ran = [name for name in found if name.startswith("test_")]
    assert len(ran) == 2
    for name in ran:
        found[name]()


def _example(folder: Path) -> Any:
    """docs/agents.md's agent module, imported as its tests import it."""
    agent_example(folder)
    sys.path.insert(0, str(folder))
    sys.modules.pop("research_agents", None)
    try:
        import research_agents  # type: ignore[import-not-found]
    finally:
        sys.path.remove(str(folder))
    return research_agents


@pytest.fixture(autouse=True)
def _no_deployment_settings(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for name in ("FSM_REDIS_URL", "FSM_CHANNEL_PREFIX", "FSM_REDIS_REPLICAS"):
        monkeypatch.delenv(name, raising=False)
    for name in ("ANALYZER_REDIS_URL", "RESEARCHER_REDIS_URL", "REVIEWER_REDIS_URL"):
        monkeypatch.delenv(name, raising=False)
    yield
    sys.modules.pop("research_agents", None)


def test_the_most_specific_handler_wins() -> None:
    agent = Agent("cto", redis_url="redis://127.0.0.1:6379/0")
    for machine_type, state in (("*", "*"), ("*", "B"), ("m", "*"), ("m", "A")):
        agent.handler(machine_type, state)(lambda task, k=(machine_type, state): {"k": k})

    def picked(machine_type: str, state: str) -> Any:
        ack = agent.answer_for(machine_type, state)
        return ack and ack["output"]["k"]

    assert picked("m", "A") == ("m", "A")
    assert picked("m", "B") == ("m", "*")  # its machine type before any type's state
    assert picked("n", "B") == ("*", "B")
    assert picked("n", "C") == ("*", "*")


def _contract_task(problems_seen: list[list[dict[str, str]]]) -> tuple[Agent, Task]:
    from datetime import UTC, datetime, timedelta

    from fsm_celery.core.messages import StateTask

    agent = Agent("cto", redis_url="redis://127.0.0.1:6379/0")

    @agent.handler("cto_fix_bug", "RUN_TESTS")
    def run_tests(task: Task) -> dict[str, Any]:
        problems_seen.append(list(task.problems))
        return {"passed": True} if task.problems else {"passed": "yes"}

    message = StateTask(
        machine_id=uuid.uuid4(),
        machine_type="cto_fix_bug",
        state="RUN_TESTS",
        attempt=1,
        context={},
        prompt="",
        required_output=["passed"],
        timeout=60_000,
        deadline=datetime.now(UTC) + timedelta(minutes=1),
        task_token="t",
        output_schema={"type": "object", "properties": {"passed": {"type": "boolean"}}},
    )
    return agent, Task(message, lambda _: None)


def test_an_answer_breaking_the_tasks_contract_is_corrected_before_it_is_sent() -> None:
    seen: list[list[dict[str, str]]] = []
    agent, task = _contract_task(seen)
    answer = agent._answer(task)
    assert answer is not None and answer["output"] == {"passed": True}
    assert seen == [[], [{"pointer": "/passed", "message": "'yes' is not of type 'boolean'"}]]


def test_without_local_corrections_the_answer_is_sent_as_the_handler_gave_it() -> None:
    seen: list[list[dict[str, str]]] = []
    agent, task = _contract_task(seen)
    agent.local_corrections = 0
    answer = agent._answer(task)
    assert answer is not None and answer["output"] == {"passed": "yes"}  # the engine refuses it
