"""The LLM agent (`fsm-celery agent --llm`) as a process, against a scripted OpenAI-compatible
endpoint this test starts (never the network): the research pipeline and the research fan-out
to COMPLETE, each state answered by the "model", a broken answer corrected in a second turn, a
429 waited out after its Retry-After, and the tokens and their cost recorded on the machines."""

from __future__ import annotations

import json
import signal
from collections.abc import Callable, Iterator

import pytest

from fsm_celery.agent.scripted_llm import Script, Served
from fsm_celery.pipeline import TaskState
from fsm_celery.pipeline.orchestrator import pipeline_context
from tests.integration.conftest import ONE_MODE
from tests.support.processes import FsmEnv

RESEARCH = ("researcher", "analyzer", "reviewer")
PRICES = {"scripted-model": {"input": 2.0, "output": 8.0}}  # per million tokens


@pytest.fixture(scope="module")
def llm_env(env_factory: Callable[..., FsmEnv]) -> Iterator[FsmEnv]:
    env = env_factory("llm", agent_liveness_seconds=3.0)
    env.start_worker()
    env.start_bridge()
    yield env
    env.stop_all()


@ONE_MODE
def test_the_llm_agent_completes_the_research_definitions_with_usage_recorded(
    llm_env: FsmEnv, mode: str
) -> None:
    script = Script(bad_first=True, first_status=429)
    with Served(script) as served:
        flags = [flag for t in RESEARCH for flag in ("--agent-type", t)]
        agent = llm_env.start_agent(
            "--llm",
            *flags,
            extra_env={
                "FSM_LLM_BASE_URL": served.url,
                "FSM_LLM_MODEL": "scripted-model",
                "FSM_LLM_PRICES": json.dumps(PRICES),
            },
        )
        try:
            llm_env.wait_for_agents(len(RESEARCH))
            pipeline = llm_env.client.start_machine(
                "research_pipeline", pipeline_context(TaskState("edge caching strategies"))
            )
            fanout = llm_env.client.start_machine("research_fanout", {"query": "edge caching"})
            for mid in (pipeline, fanout):
                info = llm_env.wait_until_done(mid, timeout=90)
                assert info.status == "completed", info.error
                assert info.tokens_used > 0 and info.cost > 0  # the model's, priced
        finally:
            agent.kill(signal.SIGTERM)
    history = llm_env.client.history(pipeline)
    assert [r.to_state for r in history if r.success][-1] == "COMPLETE"
    # every state's first answer left out its keys: each was sent back and corrected
    corrections = [
        r
        for r in script.requests
        if r["messages"][-1]["role"] == "user"
        and "does not meet the contract" in r["messages"][-1]["content"]
    ]
    assert corrections
    assert all(r["response_format"]["type"] == "json_schema" for r in script.requests)
