"""Acceptance for agents: SDK and mock agent processes, routing, a killed agent, schema errors,
the research pipeline in-process and durable, and budgets."""

from __future__ import annotations

import json
import shutil
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import ExitStack
from pathlib import Path
from typing import Any

import pytest

from fsm_celery.agent.pipeline import durable_result, serve_pipeline
from fsm_celery.agent.sdk import Agent, NoAck, Task
from fsm_celery.core.messages import task_stream, task_token
from fsm_celery.pipeline import AgentOrchestrator, TaskState
from fsm_celery.pipeline.orchestrator import pipeline_context
from tests.support.credentials import TEST_SECRET
from tests.support.processes import FsmEnv
from tests.support.services import RedisServer

SHIPPED = {
    "cto_build_project": {"projectName": "sla-api", "githubIssue": 726},
    "cto_fix_bug": {"projectName": "sla-api", "githubIssue": 740},
    "cto_infrastructure_check": {},
    "research_pipeline": pipeline_context(TaskState("edge caching strategies")),
}
RESEARCH = ("researcher", "analyzer", "reviewer")  # the research pipeline's agent types


@pytest.fixture(scope="module")
def agents_env(env_factory: Callable[..., FsmEnv]) -> Iterator[FsmEnv]:
    env = env_factory("agents", agent_liveness_seconds=3.0)
    env.start_worker(beat=True)
    env.start_bridge()
    yield env
    env.stop_all()


def _run_every_shipped_definition(env: FsmEnv) -> None:
    ids = {name: env.client.start_machine(name, context) for name, context in SHIPPED.items()}
    for name, mid in ids.items():
        info = env.wait_until_done(mid, timeout=60)
        assert info.status == "completed", (name, info.error)
        if name != "research_pipeline":
            assert info.agent_id is not None  # routed to a live agent of the type
        # The research pipeline ends in a state of another type than REVIEWING's, its agent no
        # longer assigned; that it completed says that each of its types' agents served it.


@pytest.mark.parametrize(
    "command",
    [
        ("tests/integration/sdk_agent.py", "cto", "6b0d7f39-1c1e-4b0f-9d4e-1a1c2b3d4e51"),
        (
            "--mock",
            "--agent-type",
            "cto",
            *(flag for t in RESEARCH for flag in ("--agent-type", t)),
        ),
    ],
    ids=["sdk-process", "mock-process"],
)
def test_an_agent_process_drives_every_shipped_definition(
    agents_env: FsmEnv, command: tuple[str, ...]
) -> None:
    procs = [agents_env.start_agent(*command)]
    if command[0].endswith(".py"):  # the SDK script serves one agent type per process
        for agent_type in RESEARCH:
            procs.append(agents_env.start_agent(command[0], agent_type, str(uuid.uuid4())))
    try:
        agents_env.wait_for_agents(1 + len(RESEARCH))
        _run_every_shipped_definition(agents_env)
    finally:
        for proc in procs:
            proc.kill(signal.SIGTERM)
    deadline = time.monotonic() + 10
    while any(a["status"] == "active" for a in agents_env.client.agents()):
        assert time.monotonic() < deadline, "stopped agents still count as active"
        time.sleep(0.1)


def test_an_agent_killed_mid_task_is_retried_and_a_restarted_agent_completes(
    agents_env: FsmEnv, tmp_path: Path
) -> None:
    agent_id = str(uuid.uuid4())
    marker = tmp_path / "first-visit"
    script = ("tests/integration/sdk_agent.py", "tester", agent_id, str(marker))
    first = agents_env.start_agent(*script)
    mid = agents_env.client.start_machine("test_linear", {}, agent_id=agent_id)
    deadline = time.monotonic() + 20
    while not marker.exists():
        assert time.monotonic() < deadline, "the agent never started the task"
        time.sleep(0.05)
    first.kill()  # SIGKILL in the middle of the handler: no ack, no more heartbeats
    deadline = time.monotonic() + 20
    while len(agents_env.client.history(mid)) < 2:  # the attempt times out with nobody there
        assert time.monotonic() < deadline, "the attempt never timed out"
        time.sleep(0.1)
    agents_env.start_agent(*script)
    info = agents_env.wait_until_done(mid, timeout=40)
    assert info.status == "completed"
    history = agents_env.client.history(mid)
    assert (history[1].event, history[1].from_state, history[1].to_state) == (
        "timeout",
        "ONE",
        "ONE",
    )
    assert [r.to_state for r in history if r.success] == ["ONE", "TWO", "THREE", "DONE"]


class _ThreadAgent:
    """An SDK agent run on a thread of the test process (real Redis, real engine)."""

    def __init__(
        self, env: FsmEnv, agent_type: str, setup: Callable[[Agent], object], **options: Any
    ) -> None:
        self.agent = Agent(
            agent_type,
            redis_url=env.settings.redis_url,
            prefix=env.settings.channel_prefix,
            status_interval=1.0,
            shutdown_grace=2.0,
            **options,
        )
        setup(self.agent)
        self.thread = threading.Thread(target=self.agent.run, kwargs={"install_signals": False})

    def __enter__(self) -> Agent:
        self.thread.start()
        return self.agent

    def __exit__(self, *_: object) -> None:
        self.agent.stop()
        self.thread.join(10)


def test_a_state_task_that_breaks_the_schema_is_answered_with_a_clear_error(
    agents_env: FsmEnv,
) -> None:
    seen: list[str] = []

    def setup(agent: Agent) -> None:
        @agent.handler("test_pair", "FIRST")
        def first(task: Task) -> dict[str, Any]:
            seen.append(task.state)
            if len(seen) == 1:
                raise NoAck  # stay silent: the test sends a corrupt copy of this task
            return {"first": 1}

        @agent.handler("test_pair", "SECOND")
        def second(task: Task) -> dict[str, Any]:
            return {"second": 2}

    with _ThreadAgent(agents_env, "pairs", setup) as agent:
        mid = agents_env.client.start_machine("test_pair", {}, agent_id=agent.id)
        deadline = time.monotonic() + 10
        while not seen:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        task = _last_task(agents_env, mid)
        corrupt = {**task, "timeout": "soon", "requiredOutput": "first"}
        agents_env.redis.xadd(
            task_stream(agent.id, agents_env.settings.channel_prefix),
            {"message": json.dumps(corrupt)},
        )
        info = agents_env.wait_until_done(mid, timeout=20)
    assert info.status == "completed"  # the agent kept serving after the bad message
    refused = agents_env.client.history(mid)[1]
    assert (refused.from_state, refused.to_state, refused.success) == ("FIRST", "FIRST", False)
    assert "invalid state_task" in (refused.error_message or "")
    assert "timeout: Input should be a valid integer" in (refused.error_message or "")


def _contract_agent(problems_seen: list[list[dict[str, str]]]) -> Callable[[Agent], None]:
    """An agent whose CHECK answers `passed: "yes"` (a string where the contract says a
    boolean) until it is told what is wrong, then corrects it."""

    def setup(agent: Agent) -> None:
        @agent.handler("test_contract", "CHECK")
        def check(task: Task) -> dict[str, Any]:
            problems_seen.append(list(task.problems))
            return {"passed": True} if task.problems else {"passed": "yes"}

    return setup


def test_an_sdk_agent_corrects_an_answer_the_engine_refused(agents_env: FsmEnv) -> None:
    seen: list[list[dict[str, str]]] = []
    setup = _contract_agent(seen)
    with _ThreadAgent(agents_env, "tester", setup, local_corrections=0) as agent:
        mid = agents_env.client.start_machine("test_contract", {}, agent_id=agent.id)
        info = agents_env.wait_until_done(mid, timeout=20)
    assert (info.status, info.current_state) == ("completed", "DONE")
    assert seen[0] == []
    assert [p["pointer"] for p in seen[1]] == ["/passed"]  # the engine's refusal, as sent
    history = agents_env.client.history(mid)
    assert [(h.event, h.attempt) for h in history] == [("start", 0), ("refused", 1), ("ack", 1)]


def test_an_sdk_agent_checks_its_answer_against_the_contract_before_sending(
    agents_env: FsmEnv,
) -> None:
    seen: list[list[dict[str, str]]] = []
    with _ThreadAgent(agents_env, "tester", _contract_agent(seen)) as agent:
        mid = agents_env.client.start_machine("test_contract", {}, agent_id=agent.id)
        info = agents_env.wait_until_done(mid, timeout=20)
    assert info.status == "completed"
    assert len(seen) == 2 and [p["pointer"] for p in seen[1]] == ["/passed"]
    assert [h.event for h in agents_env.client.history(mid)] == ["start", "ack"]  # none refused


NODE = shutil.which("node")


def test_the_node_example_agent_corrects_a_refused_answer(agents_env: FsmEnv) -> None:
    assert NODE is not None, "Node.js 20 is needed (apt-get install nodejs; .ci/run does)"
    agent_id = str(uuid.uuid4())
    env = {**agents_env.env, "FIRST_ANSWER_WRONG": "1"}
    argv = [str(NODE), "examples/node-agent/agent.mjs", "tester", agent_id]
    node = agents_env._spawn("node-agent", argv, env)
    try:
        node.wait_for_log(f"agent {agent_id}")
        mid = agents_env.client.start_machine("test_contract", {}, agent_id=uuid.UUID(agent_id))
        info = agents_env.wait_until_done(mid, timeout=20)
    finally:
        node.stop()
    assert (info.status, info.current_state) == ("completed", "DONE")
    history = agents_env.client.history(mid)
    assert [(h.event, h.attempt) for h in history] == [("start", 0), ("refused", 1), ("ack", 1)]
    assert history[1].output == {"passed": "true", "score": 7}
    assert "refused" in node.log.read_text()


def _last_task(env: FsmEnv, mid: uuid.UUID) -> dict[str, Any]:
    """Rebuild the state_task the engine sent last (the SDK deleted the original entry)."""
    info = env.client.get_machine(mid)
    return {
        "type": "state_task",
        "machineId": str(mid),
        "machineType": info.type,
        "state": info.current_state,
        "attempt": info.attempt,
        "context": info.context,
        "prompt": "",
        "requiredOutput": [],
        "timeout": 300_000,
        "deadline": "2999-01-01T00:00:00Z",
        "taskToken": task_token(TEST_SECRET, mid, info.current_state, info.attempt),
    }


@pytest.mark.parametrize(
    ("rejections", "visited", "status"),
    [
        (0, ["PENDING", "RESEARCHING", "ANALYZING", "REVIEWING", "COMPLETE"], "COMPLETE"),
        (2, ["PENDING", "RESEARCHING"] + ["ANALYZING", "REVIEWING"] * 3 + ["COMPLETE"], "COMPLETE"),
        (5, ["PENDING", "RESEARCHING"] + ["ANALYZING", "REVIEWING"] * 3 + ["FAILED"], "FAILED"),
    ],
    ids=["approved-first", "rejected-twice", "past-max-iterations"],
)
def test_research_pipeline_in_process_and_durable_take_the_same_path(
    agents_env: FsmEnv, rejections: int, visited: list[str], status: str
) -> None:
    query = "how do CRDTs merge concurrent edits?"
    orchestrator = AgentOrchestrator()
    local = orchestrator.run(query, max_iterations=3, rejections=rejections)
    assert orchestrator.visited == visited
    assert local.status == status
    with ExitStack() as agents:
        for agent_type in RESEARCH:
            agents.enter_context(_ThreadAgent(agents_env, agent_type, serve_pipeline))
        state = TaskState(query, max_iterations=3, metadata={"rejections": rejections})
        mid = agents_env.client.start_machine("research_pipeline", pipeline_context(state))
        info = agents_env.wait_until_done(mid, timeout=30)
    assert agents_env.visited(mid) == visited
    durable = durable_result(info.context, info.status, info.error)
    assert durable.to_dict() == local.to_dict()
    if status == "FAILED":
        assert "loop limit reached" in (durable.error or "")


def test_a_machine_over_its_budget_pauses_until_an_admin_raises_it(agents_env: FsmEnv) -> None:
    def setup(agent: Agent) -> None:
        @agent.handler("test_budget")
        def spend(task: Task) -> dict[str, Any]:
            return {"tokensUsed": 60, "cost": 0.01}

    with _ThreadAgent(agents_env, "budgeted", setup) as agent:
        mid = agents_env.client.start_machine("test_budget", {}, agent_id=agent.id)
        deadline = time.monotonic() + 20
        while (info := agents_env.client.get_machine(mid)).status != "paused":
            assert time.monotonic() < deadline, info
            time.sleep(0.05)
        assert (info.current_state, info.tokens_used) == ("THREE", 120)
        assert info.error == "budget exceeded: 120 tokens used, budget 100"
        time.sleep(0.5)
        assert agents_env.client.get_machine(mid).status == "paused"  # spends nothing more
        agents_env.client.set_budget(mid, actor="finance", tokens=1000)
        done = agents_env.wait_until_done(mid, timeout=20)
    assert (done.status, done.tokens_used, round(done.cost, 2)) == ("completed", 180, 0.03)
    resume = [r for r in agents_env.client.history(mid) if r.event == "resume"]
    assert resume[0].actor == "finance"
    usage = agents_env.client.stats()["usage"]
    assert usage["by_type"]["test_budget"]["tokens"] >= 180
    assert usage["by_agent"][agent.id]["tokens"] == 180


def test_langgraph_nodes_serve_as_durable_agents(agents_env: FsmEnv) -> None:
    from typing import TypedDict

    from langgraph.graph import END, START, StateGraph

    from fsm_celery.langgraph import node_handler

    class PairState(TypedDict, total=False):
        first: int
        second: int

    def first(state: dict[str, Any]) -> dict[str, Any]:
        return {"first": 1}

    def second(state: dict[str, Any]) -> dict[str, Any]:
        return {"second": state["first"] + 1}

    native = StateGraph(PairState)
    native.add_node("FIRST", first)
    native.add_node("SECOND", second)
    native.add_edge(START, "FIRST")
    native.add_edge("FIRST", "SECOND")
    native.add_edge("SECOND", END)
    assert native.compile().invoke({}) == {"first": 1, "second": 2}  # they are LangGraph nodes

    def setup(agent: Agent) -> None:
        agent.handler("test_pair", "FIRST")(node_handler(first))
        agent.handler("test_pair", "SECOND")(node_handler(second))

    with _ThreadAgent(agents_env, "graphs", setup) as agent:
        mid = agents_env.client.start_machine("test_pair", {}, agent_id=agent.id)
        info = agents_env.wait_until_done(mid, timeout=20)
    assert info.status == "completed"
    assert (info.context["first"], info.context["second"]) == (1, 2)


def test_an_agent_works_on_at_most_its_concurrency(agents_env: FsmEnv) -> None:
    running = 0
    most = 0
    lock = threading.Lock()

    def setup(agent: Agent) -> None:
        agent.concurrency = 2

        @agent.handler("test_pair")
        def slow(task: Task) -> dict[str, Any]:
            nonlocal running, most
            with lock:
                running += 1
                most = max(most, running)
            time.sleep(0.3)
            with lock:
                running -= 1
            return {"first": 1, "second": 2}

    with _ThreadAgent(agents_env, "limited", setup) as agent:
        ids = [
            agents_env.client.start_machine("test_pair", {}, agent_id=agent.id) for _ in range(6)
        ]
        infos = [agents_env.wait_until_done(mid, timeout=30) for mid in ids]
    assert {i.status for i in infos} == {"completed"}
    assert most == 2


def test_shutdown_hands_back_unfinished_work_without_spending_a_retry(agents_env: FsmEnv) -> None:
    release = threading.Event()

    def stubborn(agent: Agent) -> None:
        agent.shutdown_grace = 0.5

        @agent.handler("test_pair")
        def hold(task: Task) -> dict[str, Any]:
            release.wait(10)
            return {"first": 1}

    def willing(agent: Agent) -> None:
        @agent.handler("test_pair")
        def answer(task: Task) -> dict[str, Any]:
            return {"first": 1, "second": 2}

    shared_id = str(uuid.uuid4())
    first = _ThreadAgent(agents_env, "handoff", stubborn)
    first.agent.id = shared_id
    with first:
        mid = agents_env.client.start_machine("test_pair", {}, agent_id=shared_id)
        agents_env.wait_for_state(mid, "FIRST")
        time.sleep(0.5)  # the handler is holding the task
    release.set()
    deadline = time.monotonic() + 10
    while len(agents_env.client.history(mid)) < 2:
        assert time.monotonic() < deadline, "nothing was handed back"
        time.sleep(0.05)
    handed = agents_env.client.history(mid)[1]
    assert (handed.event, handed.success, handed.error_message) == (
        "handback",
        False,
        "handed back: the agent is shutting down",
    )
    assert agents_env.client.get_machine(mid).attempt == 2  # sent again at once, retries intact
    second = _ThreadAgent(agents_env, "handoff", willing)
    second.agent.id = shared_id
    with second:
        assert agents_env.wait_until_done(mid, timeout=20).status == "completed"


@pytest.fixture
def restartable(
    env_factory: Callable[..., FsmEnv], tmp_path: Path
) -> Iterator[tuple[FsmEnv, RedisServer]]:
    """A deployment on a Redis of the test's own, which it restarts."""
    server = RedisServer(tmp_path)
    env = env_factory("agents_restart", redis_url=server.url, agent_liveness_seconds=3.0)
    env.start_worker(beat=True)
    env.start_bridge()
    yield env, server
    env.stop_all()
    server.stop()


def test_agents_reconnect_after_redis_restarts(restartable: tuple[FsmEnv, RedisServer]) -> None:
    agents_env, server = restartable

    def setup(agent: Agent) -> None:
        @agent.handler("test_linear")
        def answer(task: Task) -> dict[str, Any]:
            time.sleep(0.05)
            return {"one": 1, "two": 2, "three": 3}

    with _ThreadAgent(agents_env, "survivor", setup) as agent:
        ids = [
            agents_env.client.start_machine("test_linear", {}, agent_id=agent.id) for _ in range(20)
        ]
        time.sleep(0.3)
        server.restart()
        infos = [agents_env.wait_until_done(mid, timeout=60) for mid in ids]
    assert {i.status for i in infos} == {"completed"}
