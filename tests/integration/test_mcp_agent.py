"""The MCP door for agents, driven by the `mcp` package's own client as a coding agent would,
against a real `fsm-celery mcp agent` process under the agent's own Redis credentials: over
stdio a machine worked to COMPLETE (a refused answer corrected), a cancel seen, the held
task's machine's history and state's definition read as resources (and, without a database,
what they need); over streamable HTTP the bearer check, one session unable to answer
another's task, and a cto_fix_bug worked to COMPLETE by a `cto` door, its test report
corrected."""

from __future__ import annotations

import json
import socket
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import httpx
import httpx2
import pytest
from mcp.client import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from fsm_celery.mcp.agent import ANSWERED, CANCELLED, NO_TASK, password_of
from fsm_celery.mcp.machine import NEEDS_DATABASE
from tests.support import ROOT
from tests.support.processes import FsmEnv

AGENT_TYPE = "tester"  # test_door's
T = TypeVar("T")
Session = Callable[[ClientSession], Awaitable[T]]


@pytest.fixture(scope="module")
def door(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    env = env_factory("mcp_agent", transition_mode="celery")
    # The shipped infrastructure check's round (every quarter hour, for `cto` agents) would be
    # handed to a test's `cto` door that expects its own machine's task: a test crossing a
    # quarter hour failed so (a CHECK_UPTIME task where a cto_fix_bug state was due).
    env.client.pause_schedule("cto_infrastructure_check", "tests", "one machine a test")
    env.start_worker(beat=True)
    env.start_bridge()
    return env


def credentials(env: FsmEnv) -> tuple[str, str]:
    """A new agent of the type, its Redis user created: its id and its URL."""
    agent_id = str(uuid.uuid4())
    return agent_id, env.issue_credentials(agent_id, AGENT_TYPE)


def over_stdio(env: FsmEnv, url: str, work: Session[T], *, database: bool = True) -> T:
    """`work` done in an MCP session with `fsm-celery mcp agent` over stdio, as the agent
    (given the deployment's database, or its Redis credentials alone)."""
    environ = {**env.env, "FSM_REDIS_URL": url}
    if not database:
        del environ["FSM_DATABASE_URL"]
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "fsm_celery", "mcp", "agent", "--agent-type", AGENT_TYPE],
        env=environ,
        cwd=str(ROOT),
    )

    async def run() -> T:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)

    return anyio.run(run)


async def call(session: ClientSession, tool: str, /, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer (fails the test on a tool error)."""
    result = await session.call_tool(tool, arguments)
    text = " ".join(getattr(block, "text", "") for block in result.content)
    assert not result.is_error, text
    return dict(result.structured_content or json.loads(text))


async def resource(session: ClientSession, part: str) -> Any:
    """The held task's resource fsm-celery://task/PART, as JSON."""
    read = await session.read_resource(f"fsm-celery://task/{part}")
    return json.loads(getattr(read.contents[0], "text", ""))


async def next_task(session: ClientSession) -> dict[str, Any]:
    """The task next_task gives within 30 s (fails the test without one)."""
    taken = await call(session, "next_task", wait_seconds=30)
    assert taken["task"] is not None, taken
    return dict(taken["task"])


def test_a_scripted_coding_agent_works_a_machine_to_complete_correcting_a_refused_answer(
    door: FsmEnv,
) -> None:
    agent_id, url = credentials(door)
    mid = door.client.start_machine("test_door", {"n": 1}, agent_id=agent_id)

    async def work(session: ClientSession) -> list[Any]:
        seen: list[Any] = []
        task = await next_task(session)
        again = await next_task(session)  # a session holds one task: the same one
        seen += [task["machine_id"], task["state"], again == task, task["output_contract"]]
        for part in ("context", "contract"):
            read = await session.read_resource(f"fsm-celery://task/{part}")
            shown = json.loads(getattr(read.contents[0], "text", ""))
            seen.append(
                shown == (task["context"] if part == "context" else task["output_contract"])
            )
        seen.append(await call(session, "heartbeat", progress="reading the context"))
        refused = await call(session, "submit", output={"n": task["context"]["n"]})
        seen.append(refused["problems"])
        for key in ("one", "two", "three"):
            accepted = await call(session, "submit", output={key: True})
            seen.append(accepted["message"])
            if key != "three":
                seen.append((await next_task(session))["state"])
        return seen

    seen = over_stdio(door, url, work)
    assert seen == [
        str(mid),
        "ONE",
        True,
        {"type": "object", "required": ["one"]},
        True,
        True,
        {"sent": True},
        ["/: 'one' is a required property"],
        ANSWERED,
        "TWO",
        ANSWERED,
        "THREE",
        ANSWERED,
    ]
    assert door.wait_until_done(mid).status == "completed"
    assert door.visited(mid)[-4:] == ["ONE", "TWO", "THREE", "DONE"]


def test_the_held_tasks_machine_history_and_state_definition_are_resources(
    door: FsmEnv,
) -> None:
    agent_id, url = credentials(door)
    mid = door.client.start_machine("test_door", {"n": 1}, agent_id=agent_id)

    async def work(session: ClientSession) -> list[Any]:
        await next_task(session)
        first = [await resource(session, part) for part in ("history", "definition")]
        await call(session, "submit", output={"one": 1})
        await next_task(session)
        second = [await resource(session, part) for part in ("history", "definition")]
        return first + second

    history, definition, later, next_definition = over_stdio(door, url, work)
    assert history["machine_id"] == str(mid)
    assert history["steps"] == [r.to_dict() for r in door.client.history(mid)][:1]
    assert [(s["event"], s["to_state"]) for s in later["steps"]] == [
        ("start", "ONE"),
        ("ack", "TWO"),
    ]
    assert later["steps"][1]["output"] == {"one": 1}
    assert definition == {
        "machine_type": "test_door",
        "version": door.client.get_machine(mid).definition_version,
        "state": "ONE",
        "kind": "agent",
        "description": "",
        "prompt": "",
        "required_output": ["one"],
        "output_schema": None,
        "max_corrections": None,
        "timeout_seconds": 120.0,
        "max_retries": 10,
        "transitions": {
            "on_success": [{"target": "TWO", "when": None, "loop": False}],
            "on_failure": {"target": "FAILED", "when": None, "loop": False},
        },
    }
    assert (next_definition["state"], next_definition["required_output"]) == ("TWO", ["two"])
    door.client.cancel(mid, "admin", "test")


def test_without_a_database_the_history_and_definition_say_what_they_need(
    door: FsmEnv,
) -> None:
    agent_id, url = credentials(door)
    mid = door.client.start_machine("test_door", {"n": 1}, agent_id=agent_id)

    async def work(session: ClientSession) -> list[Any]:
        task = await next_task(session)
        parts = [await resource(session, p) for p in ("context", "history", "definition")]
        await call(session, "submit", output={"one": 1})
        return [task["state"], *parts]

    seen = over_stdio(door, url, work, database=False)
    needed = {"message": NEEDS_DATABASE}
    state, context, *unavailable = seen
    assert (state, context["n"]) == ("ONE", 1)  # the task's own parts still served
    assert unavailable == [needed, needed]
    door.wait_for_state(mid, "TWO")
    door.client.cancel(mid, "admin", "test")


def test_without_a_held_task_the_resources_say_so(door: FsmEnv) -> None:
    _, url = credentials(door)

    async def work(session: ClientSession) -> list[Any]:
        return [await resource(session, p) for p in ("history", "definition")]

    assert over_stdio(door, url, work) == [{"message": NO_TASK}] * 2


def test_submit_with_next_wait_seconds_takes_the_next_task_in_its_answer(door: FsmEnv) -> None:
    agent_id, url = credentials(door)
    mid = door.client.start_machine("test_door", {}, agent_id=agent_id)

    async def work(session: ClientSession) -> list[Any]:
        task = await next_task(session)
        refused = await call(session, "submit", output={}, next_wait_seconds=30)
        second = await call(session, "submit", output={"one": 1}, next_wait_seconds=30)
        held = await next_task(session)  # the task `next` gave is the session's
        third = await call(session, "submit", output={"two": 2}, next_wait_seconds=30)
        last = await call(session, "submit", output={"three": 3}, next_wait_seconds=1)
        return [
            task["state"],
            "next" in refused,
            second["accepted"],
            second["next"]["task"]["state"],
            held == second["next"]["task"],
            third["next"]["task"]["state"],
            last["accepted"],
            last["next"]["task"],
        ]

    seen = over_stdio(door, url, work)
    assert seen == ["ONE", False, True, "TWO", True, "THREE", True, None]
    assert door.wait_until_done(mid).status == "completed"


def test_a_cancelled_attempt_is_reported_on_the_next_call_and_dropped(door: FsmEnv) -> None:
    agent_id, url = credentials(door)
    mid = door.client.start_machine("test_door", {}, agent_id=agent_id)

    async def work(session: ClientSession) -> list[Any]:
        task = await next_task(session)
        await anyio.to_thread.run_sync(lambda: door.client.pause(mid, "admin", "test"))
        deadline = time.monotonic() + 15
        beat = await call(session, "heartbeat", progress="working")
        while beat.get("message") != CANCELLED and time.monotonic() < deadline:
            await anyio.sleep(0.1)
            beat = await call(session, "heartbeat", progress="working")
        after = await call(session, "submit", output={"one": 1})
        none = await call(session, "next_task", wait_seconds=1)
        return [task["state"], beat, after, none["task"]]

    seen = over_stdio(door, url, work)
    assert seen == [
        "ONE",
        {"sent": False, "message": CANCELLED},
        {"accepted": False, "message": NO_TASK},
        None,
    ]
    assert door.client.get_machine(mid).status == "paused"
    door.client.cancel(mid, "admin", "test")


def test_fail_and_hand_back_answer_the_held_task(door: FsmEnv) -> None:
    agent_id, url = credentials(door)
    mid = door.client.start_machine("test_door", {}, agent_id=agent_id)

    async def work(session: ClientSession) -> list[Any]:
        first = await next_task(session)
        handed = await call(session, "hand_back", reason="not mine to do")
        again = await next_task(session)  # back at once, to the only live agent: this one
        failed = await call(session, "fail", error="cannot build")
        retried = await next_task(session)
        await call(session, "submit", output={"one": 1})
        return [first["attempt"], handed["accepted"], again["state"], failed, retried["state"]]

    attempt, handed, again, failed, retried = over_stdio(door, url, work)
    assert (attempt, handed, again, retried) == (1, True, "ONE", "ONE")
    assert failed == {"accepted": True, "message": ANSWERED}
    events = [r.event for r in door.client.history(mid)]
    assert "handback" in events
    door.client.cancel(mid, "admin", "test")


def test_a_task_sent_while_one_is_held_waits_and_comes_after_it(door: FsmEnv) -> None:
    agent_id, url = credentials(door)
    first = door.client.start_machine("test_door", {}, agent_id=agent_id)

    async def work(session: ClientSession) -> tuple[list[tuple[str, str]], str]:
        worked = [((await next_task(session))["machine_id"], "ONE")]
        second = await anyio.to_thread.run_sync(
            lambda: door.client.start_machine("test_door", {}, agent_id=agent_id)
        )
        await anyio.sleep(1)  # sent while the first one is held
        await call(session, "submit", output={"one": 1})
        while (str(second), "ONE") not in worked and len(worked) < 4:
            task = await next_task(session)
            worked.append((task["machine_id"], task["state"]))
            await call(session, "submit", output={task["state"].lower(): 1})
        return worked, str(second)

    worked, second = over_stdio(door, url, work)
    assert worked[0] == (str(first), "ONE")
    assert (second, "ONE") in worked
    assert len(set(worked)) == len(worked)  # each attempt taken once
    for mid in (first, second):
        if door.client.get_machine(mid).status == "running":
            door.client.cancel(mid, "admin", "test")


@pytest.fixture(scope="module")
def http_door(door: FsmEnv) -> tuple[str, str, str]:
    """A real `fsm-celery mcp agent --http`: its URL, its agent's id and Redis password."""
    agent_id, url = credentials(door)
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "fsm_celery", "mcp", "agent", "--agent-type", AGENT_TYPE]
    argv += ["--http", "--port", str(port)]
    proc = door._spawn("mcp-agent-http", argv, {**door.env, "FSM_REDIS_URL": url})
    proc.wait_for_log("Application startup complete")
    password = password_of(url)
    assert password is not None
    return f"http://127.0.0.1:{port}/mcp", agent_id, password


@pytest.mark.parametrize("header", [None, "Bearer not-the-password", "Basic password"])
def test_http_without_the_agents_password_as_bearer_is_401(
    http_door: tuple[str, str, str], header: str | None
) -> None:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if header is not None:
        headers["Authorization"] = header
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    answer = httpx.post(http_door[0], json=body, headers=headers, timeout=10)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"


def test_http_a_second_session_cannot_answer_the_first_ones_task(
    door: FsmEnv, http_door: tuple[str, str, str]
) -> None:
    url, agent_id, password = http_door
    mid = door.client.start_machine("test_door", {}, agent_id=agent_id)

    async def run() -> list[Any]:
        headers = {"Authorization": f"Bearer {password}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as first,
            streamable_http_client(url, http_client=http) as (read2, write2),
            ClientSession(read2, write2) as second,
        ):
            await first.initialize()
            await second.initialize()
            held = await next_task(first)
            stolen = await call(second, "submit", output={"one": 1})
            own = await call(second, "next_task", wait_seconds=1)
            answered = await call(first, "submit", output={"one": 1})
            return [held["machine_id"], stolen, own["task"], answered["accepted"]]

    seen = anyio.run(run)
    assert seen == [str(mid), {"accepted": False, "message": NO_TASK}, None, True]
    door.wait_for_state(mid, "TWO")
    door.client.cancel(mid, "admin", "test")


# What a coding agent answers at each state of cto_fix_bug (definitions/cto_fix_bug.yaml).
FIX_BUG = {
    "ANALYZE_BUG": {"reproduced": True},
    "LOCATE_CODE": {"location": "sla/api.py:42"},
    "WRITE_FIX": {"filesChanged": ["sla/api.py", "tests/test_api.py"]},
    "RUN_TESTS": {"passed": True, "coverage": 91},
    "COMMIT_PUSH": {"commitHash": "4f2a9c1"},
    "DEPLOY": {"deploymentUrl": "https://sla-api.example.com"},
}


def test_http_a_coding_agent_works_a_cto_fix_bug_to_complete_correcting_its_test_report(
    door: FsmEnv,
) -> None:
    """The issue's scenario over streamable HTTP: a `cto` door, a cto_fix_bug machine worked
    state by state; RUN_TESTS answered first with `passed: "yes"`, refused with the pointer,
    then corrected."""
    agent_id = str(uuid.uuid4())
    redis_url = door.issue_credentials(agent_id, "cto")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "fsm_celery", "mcp", "agent", "--agent-type", "cto"]
    proc = door._spawn(
        "mcp-agent-cto",
        [*argv, "--http", "--port", str(port)],
        {**door.env, "FSM_REDIS_URL": redis_url},
    )
    proc.wait_for_log("Application startup complete")
    password = password_of(redis_url)
    mid = door.client.start_machine(
        "cto_fix_bug", {"projectName": "sla-api", "githubIssue": 740}, agent_id=agent_id
    )

    async def run() -> list[Any]:
        headers = {"Authorization": f"Bearer {password}"}
        worked: list[Any] = []
        async with (
            httpx2.AsyncClient(headers=headers, timeout=60) as http,
            streamable_http_client(f"http://127.0.0.1:{port}/mcp", http_client=http) as (r, w),
            ClientSession(r, w) as session,
        ):
            await session.initialize()
            for _ in FIX_BUG:
                task = await next_task(session)
                state = task["state"]
                if state == "RUN_TESTS":
                    refused = await call(session, "submit", output={"passed": "yes"})
                    worked.append(refused["problems"])
                answered = await call(session, "submit", output=FIX_BUG[state])
                worked.append((state, answered["accepted"]))
        return worked

    try:
        worked = anyio.run(run)
    finally:
        proc.terminate()
    problems = worked.pop(3)  # the refusal of RUN_TESTS's first answer: the pointer named
    assert any(p.startswith("/passed: 'yes' is not of type 'boolean'") for p in problems)
    assert worked == [(state, True) for state in FIX_BUG]
    info = door.wait_until_done(mid, timeout=60)
    assert info.status == "completed"
    assert door.visited(mid)[-2:] == ["DEPLOY", "COMPLETE"]
