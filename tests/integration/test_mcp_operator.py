"""The MCP door for operators, driven by the `mcp` package's own client against a real
`fsm-celery mcp operator` process: over stdio as one identity (an admin's, a viewer's, an
approver's token), and over streamable HTTP, each request as its bearer token's."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, TypeVar

import anyio
import httpx
import httpx2
import pytest
from mcp.client import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client

from fsm_celery.mcp.arguments import PAGE_MOST
from tests.support import ROOT
from tests.support.agents import ScriptedAgent
from tests.support.credentials import ADMIN_TOKEN, VIEWER_TOKEN
from tests.support.processes import FsmEnv

ALICE = "alice-token-for-the-mcp-door-5e2a9c71d3b84f06"
CAROL = "carol-token-for-the-mcp-door-0b7d4e19a6c25f83"
DAVE = "dave-token-for-the-mcp-door-8f1c3a6e27d94b50"
APPROVERS = {
    "alice": {"groups": ["release"], "token": ALICE},
    "carol": {"groups": ["release"], "token": CAROL},
    "dave": {"groups": ["ops"], "token": DAVE},
}
READS = {
    "list_machines",
    "count_machines",
    "machine_status",
    "machine_history",
    "machine_context",
    "machine_tree",
    "machine_children",
    "machine_decisions",
    "machine_events",
    "pending_approvals",
    "list_definitions",
    "describe_definition",
    "replay_machine",
    "replay_definition",
    "stats",
    "rejected_messages",
}
T = TypeVar("T")
Session = Callable[[ClientSession], Awaitable[T]]


@pytest.fixture(scope="module")
def door(env_factory: Callable[..., FsmEnv]) -> Iterator[FsmEnv]:
    """A celery-mode deployment with two approvers of the release group."""
    env = env_factory("mcp_operator", approvers=APPROVERS, transition_mode="celery")
    env.start_worker(beat=False)
    env.start_bridge()
    yield env


def over_stdio(env: FsmEnv, token: str, work: Session[T]) -> T:
    """`work` done in an MCP session with `fsm-celery mcp operator` over stdio, as the token."""
    params = StdioServerParameters(
        command=sys.executable,
        args=["-m", "fsm_celery", "mcp", "operator"],
        env={**env.env, "FSM_MCP_TOKEN": token},
        cwd=str(ROOT),
    )

    async def run() -> T:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            return await work(session)

    return anyio.run(run)


async def tool_names(session: ClientSession) -> set[str]:
    return {tool.name for tool in (await session.list_tools()).tools}


async def call(session: ClientSession, tool: str, /, **arguments: Any) -> dict[str, Any]:
    """A tool's structured answer (fails the test on a tool error)."""
    result = await session.call_tool(tool, arguments)
    assert not result.is_error, _text(result)
    return dict(result.structured_content or json.loads(_text(result)))


async def refusal(session: ClientSession, tool: str, /, **arguments: Any) -> str:
    """The text of a tool's error (fails the test when the call succeeds)."""
    result = await session.call_tool(tool, arguments)
    assert result.is_error, _text(result)
    return _text(result)


def _text(result: Any) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def test_a_viewer_is_listed_the_read_tools_only_and_refused_an_acting_one(door: FsmEnv) -> None:
    async def work(session: ClientSession) -> tuple[set[str], str]:
        return await tool_names(session), await refusal(
            session, "start_machine", type="test_linear", context={}
        )

    names, refused = over_stdio(door, VIEWER_TOKEN, work)
    assert names == READS
    assert "start_machine" in refused


def test_an_approver_gets_the_reads_and_approve_and_reject_with_no_actor_argument(
    door: FsmEnv,
) -> None:
    async def work(session: ClientSession) -> tuple[set[str], dict[str, Any]]:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
        return set(tools), tools["approve"].input_schema

    names, schema = over_stdio(door, ALICE, work)
    assert names == READS | {"approve", "reject"}
    assert "actor" not in schema["properties"]


def test_an_admin_starts_pauses_resumes_and_cancels_a_machine_and_reads_it(door: FsmEnv) -> None:
    async def work(session: ClientSession) -> list[str]:
        started = await call(session, "start_machine", type="test_linear", context={"n": 1})
        mid = started["machine"]["id"]
        seen = [started["machine"]["status"]]
        for tool in ("pause_machine", "resume_machine", "cancel_machine"):
            done = await call(session, tool, machine_id=mid, reason=f"{tool} over MCP")
            seen.append(done["machine"]["status"])
        status = await call(session, "machine_status", machine_id=mid[:8])
        seen.append(status["machine"]["status"])
        history = await call(session, "machine_history", machine_id=mid, context=True)
        seen += [f"{h['event']} by {h['actor']}" for h in history["items"][-3:]]
        listed = await call(session, "list_machines", type="test_linear", limit=PAGE_MOST)
        assert mid in {m["id"] for m in listed["items"]}
        return seen

    assert over_stdio(door, ADMIN_TOKEN, work) == [
        "running",
        "paused",
        "running",
        "cancelled",
        "cancelled",
        "pause by admin",
        "resume by admin",
        "cancel by admin",
    ]


def test_a_start_its_context_schema_refuses_names_the_field_and_starts_nothing(
    door: FsmEnv,
) -> None:
    async def work(session: ClientSession) -> tuple[str, int, int]:
        counted = await call(session, "count_machines", type="cto_build_project")
        refused = await refusal(
            session, "start_machine", type="cto_build_project", context={"projectName": "x"}
        )
        after = await call(session, "count_machines", type="cto_build_project")
        return refused, counted["total"], after["total"]

    refused, before, after = over_stdio(door, ADMIN_TOKEN, work)
    assert "'githubIssue' is a required property" in refused
    assert before == after


def test_a_bad_argument_is_refused_naming_it(door: FsmEnv) -> None:
    async def work(session: ClientSession) -> list[str]:
        return [
            await refusal(session, "list_machines", limit=PAGE_MOST + 1),
            await refusal(session, "machine_status", machine_id="not-an-id!"),
            await refusal(session, "send_event", machine_id="abcd1234", name="Bad Name"),
        ]

    limit, machine_id, name = over_stdio(door, ADMIN_TOKEN, work)
    assert "limit" in limit
    assert "machine_id" in machine_id
    assert "name" in name


def test_an_approver_decides_at_a_gate_as_themselves_and_only_at_their_groups(door: FsmEnv) -> None:
    with ScriptedAgent(door) as agent:
        mid = door.client.start_machine("test_gate_fast", {}, agent_id=agent.id)
        door.wait_for_gate(mid, "REVIEW", timeout=30)

        async def approve(session: ClientSession) -> dict[str, Any]:
            return await call(session, "approve", machine_id=str(mid), fields={"target": "staging"})

        async def out_of_group(session: ClientSession) -> str:
            return await refusal(session, "approve", machine_id=str(mid), fields={"target": "x"})

        assert "dave" in over_stdio(door, DAVE, out_of_group)
        over_stdio(door, ALICE, approve)
        over_stdio(door, CAROL, approve)
        door.wait_until_done(mid)
    made = door.client.decisions(mid)["decisions"]
    assert sorted((d["actor"], d["decision"], d["via"]) for d in made) == [
        ("alice", "approve", "mcp"),
        ("carol", "approve", "mcp"),
    ]
    assert door.visited(mid)[-2:] == ["SHIP", "DONE"]


def test_an_admin_sends_an_outside_event_that_moves_a_waiting_machine(door: FsmEnv) -> None:
    with ScriptedAgent(door) as agent:
        mid = door.client.start_machine("test_wait", {}, agent_id=agent.id)
        door.wait_for_state(mid, "WAIT_MERGE")

        async def send(session: ClientSession) -> dict[str, Any]:
            return await call(
                session,
                "send_event",
                machine_id=str(mid),
                name="pr_merged",
                payload={"merged": True, "number": 7},
            )

        sent = over_stdio(door, ADMIN_TOKEN, send)
        assert sent["event"]["outcome"] == "applied"
        assert door.wait_until_done(mid).status == "completed"
    assert "DEPLOY" in door.visited(mid)


def test_an_admin_rewinds_and_forks_a_machine_and_replays_it_reading_only(door: FsmEnv) -> None:
    with ScriptedAgent(door) as agent:
        mid = door.client.start_machine("test_linear", {"n": 1}, agent_id=agent.id)
        door.wait_until_done(mid)
        steps = len(door.client.history(mid))
        yaml_text = (ROOT / "tests/fixtures/definitions/test_linear.yaml").read_text()

        async def travel(session: ClientSession) -> dict[str, Any]:
            replayed = await call(session, "replay_machine", machine_id=str(mid))
            given = await call(session, "replay_machine", machine_id=str(mid), definition=yaml_text)
            context = await call(session, "machine_context", machine_id=str(mid), step=1)
            forked = await call(session, "fork_machine", machine_id=str(mid), step=1)
            rewound = await call(
                session, "rewind_machine", machine_id=str(mid), step=1, set={"n": 2}
            )
            return {
                "outcomes": [replayed["outcome"], given["outcome"]],
                "context": context["context"],
                "forked": forked["machine"],
                "rewound": rewound,
            }

        done = over_stdio(door, ADMIN_TOKEN, travel)
        assert door.wait_until_done(mid).context["n"] == 2
    assert done["outcomes"] == ["same", "same"]
    assert done["context"]["n"] == 1
    assert done["forked"]["forked_from"] == str(mid)
    rewind = [r for r in door.client.history(mid) if r.event == "rewind"]
    assert [(r.attempt, r.actor) for r in rewind] == [(done["rewound"]["step"], "admin")]
    assert done["rewound"]["step"] >= steps


def test_a_list_is_paged_by_the_cursor_each_page_gives(door: FsmEnv) -> None:
    started = {door.client.start_machine("test_wait", {}) for _ in range(3)}

    async def pages(session: ClientSession) -> list[list[str]]:
        found: list[list[str]] = []
        cursor = None
        while len(found) < 3:
            page = await call(
                session, "list_machines", type="test_wait", status="running", limit=1, cursor=cursor
            )
            found.append([m["id"] for m in page["items"]])
            cursor = page["next"]
        return found

    seen = over_stdio(door, VIEWER_TOKEN, pages)
    assert all(len(page) == 1 for page in seen)
    assert len({page[0] for page in seen}) == 3
    assert {page[0] for page in seen} == {str(mid) for mid in started}
    for mid in started:
        door.client.cancel(mid, "test")


def test_stdio_refuses_to_start_with_a_token_that_is_none_of_the_settings(door: FsmEnv) -> None:
    argv = [sys.executable, "-m", "fsm_celery", "mcp", "operator"]
    env = {**door.env, "FSM_MCP_TOKEN": "not-one-of-the-tokens"}
    done = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "none of the settings'" in done.stderr


@pytest.fixture(scope="module")
def http_door(door: FsmEnv) -> str:
    """A real `fsm-celery mcp operator --http`: its endpoint's URL."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    argv = [sys.executable, "-m", "fsm_celery", "mcp", "operator", "--http", "--port", str(port)]
    proc = door._spawn("mcp-http", argv)
    proc.wait_for_log("Application startup complete")
    return f"http://127.0.0.1:{port}/mcp"


@pytest.mark.parametrize("header", [None, "Bearer not-a-token", "Basic " + ADMIN_TOKEN])
def test_http_without_a_valid_bearer_token_is_401(http_door: str, header: str | None) -> None:
    headers = {"Content-Type": "application/json", "Accept": "application/json"}
    if header is not None:
        headers["Authorization"] = header
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}
    answer = httpx.post(http_door, json=body, headers=headers, timeout=10)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"


def over_http(url: str, token: str, work: Session[T]) -> T:
    async def run() -> T:
        headers = {"Authorization": f"Bearer {token}"}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as http,
            streamable_http_client(url, http_client=http) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            return await work(session)

    return anyio.run(run)


def test_http_lists_each_tokens_own_tools_and_acts_as_it(http_door: str) -> None:
    assert over_http(http_door, VIEWER_TOKEN, tool_names) == READS
    assert over_http(http_door, ALICE, tool_names) == READS | {"approve", "reject"}

    async def start(session: ClientSession) -> dict[str, Any]:
        started = await call(session, "start_machine", type="test_linear", context={})
        return await call(session, "cancel_machine", machine_id=started["machine"]["id"])

    assert over_http(http_door, ADMIN_TOKEN, start)["machine"]["status"] == "cancelled"


def test_start_machine_with_a_key_answers_the_same_machine_and_refuses_another_start(
    door: FsmEnv,
) -> None:
    async def work(session: ClientSession) -> tuple[dict[str, Any], dict[str, Any], str]:
        asked = {"type": "test_linear", "context": {"n": 2}, "key": "mcp-order-2"}
        first = await call(session, "start_machine", **asked)
        again = await call(session, "start_machine", **asked)
        other = await refusal(session, "start_machine", **(asked | {"type": "test_pair"}))
        return first, again, other

    first, again, other = over_stdio(door, ADMIN_TOKEN, work)
    assert (first["found"], again["found"]) == (False, True)
    assert again["machine"]["id"] == first["machine"]["id"]
    assert again["machine"]["key"] == "mcp-order-2"
    assert f"holds machine {first['machine']['id']} (a test_linear)" in other
