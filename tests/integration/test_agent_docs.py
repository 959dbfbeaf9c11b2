"""docs/agents.md's examples, run as they stand there, one for each way to be an agent, on a
deployment whose Redis has ACL users of its own (a real worker and ack bridge):

- the SDK's complete agent: one process serving research_fanout's three agent types, each under
  the Redis credentials `fsm-celery agents credentials` issued it;
- the MCP door's client script, working a cto_fix_bug through `fsm-celery mcp agent` under an
  agent's credentials (a refused answer fixed);
- the LLM agent's shell blocks (the scripted endpoint, then `fsm-celery agent --llm`), a
  research_pipeline to COMPLETE with its tokens priced;
- another language: the Node.js example agent, started by the doc's command, a cto_fix_bug to
  COMPLETE with an answer the engine refused corrected."""

from __future__ import annotations

import os
import shutil
import socket
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fsm_celery.pipeline import TaskState
from fsm_celery.pipeline.orchestrator import pipeline_context
from tests.support import ROOT
from tests.support.docs import agent_example, block_with
from tests.support.processes import FsmEnv
from tests.support.services import start_redis, stop_redis

TYPES = ("analyzer", "researcher", "reviewer")
BUG = {"projectName": "sla-api", "githubIssue": 740}
FIX_BUG = ["ANALYZE_BUG", "LOCATE_CODE", "WRITE_FIX", "RUN_TESTS", "COMMIT_PUSH", "DEPLOY"]
# what the doc's commands find on PATH: this environment's fsm-celery and python
PATH = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture(scope="module")
def locked(
    env_factory: Callable[..., FsmEnv], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FsmEnv]:
    """A deployment that accepts acks only on per-agent streams, on a Redis of its own."""
    process, port = start_redis(tmp_path_factory.mktemp("redis-agent-docs"))
    try:
        env = env_factory(
            "agent_docs", redis_url=f"redis://127.0.0.1:{port}/0", accept_shared_acks=False
        )
        env.start_worker()
        env.start_bridge()
        yield env
        env.stop_all()
    finally:
        stop_redis(process)


@pytest.mark.parametrize("how", ["script", "cli"])
def test_the_docs_agent_runs_research_fanout_under_its_credentials(
    locked: FsmEnv, tmp_path: Path, how: str
) -> None:
    example = agent_example(tmp_path)
    ids = {agent_type: str(uuid.uuid4()) for agent_type in TYPES}
    urls = {
        f"{agent_type.upper()}_REDIS_URL": locked.issue_credentials(agent_id, agent_type)
        for agent_type, agent_id in ids.items()
    }
    environ = {**urls, "PYTHONPATH": f"{tmp_path}:{ROOT}"}
    if how == "script":
        agents = locked.start_agent(str(example), extra_env=environ)
    else:
        agents = locked.start_agent("--app", "research_agents:agents", extra_env=environ)
    try:
        mid = locked.client.start_machine("research_fanout", {"query": "durable agents"})
        assert locked.wait_until_done(mid, timeout=90).status == "completed"
        context = locked.client.get_machine(mid).context
        assert context["analysis"] == "2 findings on durable agents"
        active = {a["id"]: a["agent_type"] for a in locked.wait_for_agents(3)}
        assert {ids[t]: t for t in TYPES}.items() <= active.items()  # the ids of its credentials
    finally:
        agents.stop()


def test_the_docs_mcp_client_works_a_bug_fix_through_the_agent_door(
    locked: FsmEnv, tmp_path: Path
) -> None:
    script = tmp_path / "mcp_client.py"
    script.write_text(block_with("agents.md", "python", '"""mcp_client.py'))
    agent_id = str(uuid.uuid4())
    environ = {**locked.env, "FSM_REDIS_URL": locked.issue_credentials(agent_id, "cto")}
    client = locked._spawn(
        "mcp-client", [sys.executable, str(script), "cto"], environ | {"PATH": PATH}
    )
    try:
        mid = locked.client.start_machine("cto_fix_bug", BUG, agent_id=agent_id)
        try:
            info = locked.wait_until_done(mid, timeout=90)
        except AssertionError as exc:  # what the client (and its door, on stderr) said
            raise AssertionError(f"{exc}\nthe client said:\n{client.log.read_text()}") from None
    finally:
        client.stop()
    assert (info.status, info.agent_id) == ("completed", uuid.UUID(agent_id))
    assert locked.visited(mid) == [*FIX_BUG, "COMPLETE"]
    said = client.log.read_text()
    assert "cto_fix_bug RUN_TESTS: Run the test suite of sla-api" in said
    assert "refused: /passed: 'yes' is not of type 'boolean'" in said  # by the door's submit
    assert "refused" not in [r.event for r in locked.client.history(mid)]  # never sent


def test_the_docs_llm_agent_blocks_complete_a_research_pipeline(locked: FsmEnv) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = str(probe.getsockname()[1])
    endpoint = block_with("agents.md", "sh", "fsm_celery.agent.scripted_llm")
    agent = block_with("agents.md", "sh", "fsm-celery agent --llm")
    script = (
        (endpoint + agent).replace(":8000", f":{port}").replace("--port 8000", f"--port {port}")
    )
    before = {a["id"] for a in locked.client.agents() if a["status"] == "active"}
    shell = locked._spawn("llm-agent", ["bash", "-c", script], locked.env | {"PATH": PATH})
    try:
        _wait_for_new_agents(locked, before, len(TYPES))
        state = pipeline_context(TaskState("edge caching strategies"))
        mid = locked.client.start_machine("research_pipeline", state)
        info = locked.wait_until_done(mid, timeout=90)
    finally:
        shell.stop()
    assert info.status == "completed", info.error
    assert info.tokens_used > 0 and info.cost > 0  # the scripted model's, priced by the block
    assert locked.visited(mid)[-1] == "COMPLETE"


NODE = shutil.which("node")


def test_the_docs_node_agent_works_a_bug_fix_correcting_a_refused_answer(locked: FsmEnv) -> None:
    assert NODE is not None, "Node.js 20 is needed (apt-get install nodejs; .ci/run does)"
    agent_id = str(uuid.uuid4())
    environ = locked.env | {
        "AGENT_ID": agent_id,
        "AGENT_REDIS_URL": locked.issue_credentials(agent_id, "cto"),
        "FIRST_ANSWER_WRONG": "1",
        "PATH": PATH,
    }
    command = block_with("agents.md", "sh", "node examples/node-agent/agent.mjs")
    node = locked._spawn("node-agent", ["bash", "-c", command], environ)
    try:
        node.wait_for_log(f"agent {agent_id}")
        mid = locked.client.start_machine("cto_fix_bug", BUG, agent_id=agent_id)
        info = locked.wait_until_done(mid, timeout=90)
    finally:
        node.stop()
    assert info.status == "completed", info.error
    assert locked.visited(mid) == [*FIX_BUG[:4], "RUN_TESTS", *FIX_BUG[4:], "COMPLETE"]
    [refused] = [r for r in locked.client.history(mid) if r.event == "refused"]
    assert (refused.from_state, refused.output) == ("RUN_TESTS", {"passed": "true", "coverage": 87})


def _wait_for_new_agents(env: FsmEnv, before: set[str], count: int) -> None:
    """Wait until `count` agents not among `before` report themselves active."""
    deadline = time.monotonic() + 30
    while True:
        active = {a["id"] for a in env.client.agents() if a["status"] == "active"}
        if len(active - before) >= count:
            return
        assert time.monotonic() < deadline, f"{len(active - before)} of {count} agents started"
        time.sleep(0.2)
