"""docs/agents.md's complete agent, run as it stands there: one process serving research_fanout's
three agent types, each under the Redis credentials `fsm-celery agents credentials` issued it,
through a real worker and ack bridge, on a Redis with ACL users of its own."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.docs import agent_example
from tests.support.processes import FsmEnv
from tests.support.services import start_redis, stop_redis

TYPES = ("analyzer", "researcher", "reviewer")


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
