"""Traces (issue 40 §2, docs/operations.md "Traces"): a real worker, ack bridge and SDK agent,
started with OTEL_* pointing at an OTLP/HTTP receiver the test runs, trace a fan-out machine
with a retry as one tree: the machine's run, its attempts, its children's runs and attempts,
the retried attempt twice, and the agent's handling of each attempt under it; the LLM agent's
model calls under its handling, and a tool state's MCP call under its fsm.call_tool task."""

from __future__ import annotations

import signal
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest

from fsm_celery import traces
from fsm_celery.agent.scripted_llm import Script, Served
from fsm_celery.pipeline import TaskState
from fsm_celery.pipeline.orchestrator import pipeline_context
from fsm_celery.traces.ids import attempt_span_id, machine_span_id
from tests.support import ROOT
from tests.support.otlp import OtlpReceiver, Span, serve
from tests.support.processes import FsmEnv

ROOT_TYPE = "test_fan_traced"
AGENT_STATES = 5  # PLAN, TRY twice, WORK, SHIP: the attempts an agent handles


@pytest.fixture(scope="module")
def otlp() -> Iterator[OtlpReceiver]:
    with serve() as found:
        yield found


@pytest.fixture(scope="module", params=["celery", "inline"])
def traced(
    request: pytest.FixtureRequest,
    env_factory: Callable[..., FsmEnv],
    otlp: OtlpReceiver,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[FsmEnv]:
    """A deployment of the mode whose worker, bridge and agent send their spans to the
    receiver (this process traces nothing: it decides so before OTEL_* is set for them)."""
    traces.start("tests")
    mode = str(request.param)
    tools = {  # tests/support/tool_server.py over stdio, started by the worker
        "command": [sys.executable, "-m", "tests.support.tool_server"],
        "cwd": str(ROOT),
        "env": {"TOOL_STATE_DIR": str(tmp_path_factory.mktemp("traced-tools"))},
    }
    env = env_factory(f"traces_{mode}", transition_mode=mode, mcp_servers={"checks": tools})
    with pytest.MonkeyPatch.context() as patch:
        for name, value in otlp.environment().items():
            patch.setenv(name, value)
        env.start_worker()
        env.start_bridge()
        env.start_agent("tests/integration/traced_agent.py", "tester", str(uuid.uuid4()))
    env.wait_for_agents(1)
    yield env
    env.stop_all()


def _hex(span_id: int) -> str:
    return f"{span_id:016x}"


def _of(spans: list[Span], machine: str) -> list[Span]:
    """A machine's attempt spans, in attempt order."""
    found = [s for s in spans if s.name.startswith("state ")]
    mine = [s for s in found if s.attributes.get("fsm.machine.id") == machine]
    return sorted(mine, key=lambda s: int(s.attributes["fsm.attempt"]))


def _finished(trace: str, parents_of: tuple[str, ...] = ()) -> Callable[[list[Span]], bool]:
    """Whether the trace's agent spans and root arrived, and the spans named `parents_of`
    with their three nearest ancestors."""

    def done(spans: list[Span]) -> bool:
        mine = [s for s in spans if s.trace_id == trace]
        handled = [s for s in mine if s.name.startswith("handle ")]
        roots = [s for s in mine if s.name == f"machine {ROOT_TYPE}"]
        by_id = {s.span_id: s for s in mine}
        orphans = [s for s in mine if s.name in parents_of and len(_ancestors(s, by_id)) < 3]
        return len(handled) >= AGENT_STATES and bool(roots) and not orphans

    return done


def test_a_fan_out_machine_with_a_retry_is_one_trace_of_its_attempts(
    traced: FsmEnv, otlp: OtlpReceiver
) -> None:
    mid = traced.client.start_machine(ROOT_TYPE, {})
    info = traced.wait_until_done(mid, timeout=60)
    assert info.status == "completed", info.error
    trace = mid.hex  # the root machine's id is its trace's
    spans = [s for s in otlp.wait_for(_finished(trace)) if s.trace_id == trace]

    (run,) = [s for s in spans if s.name == f"machine {ROOT_TYPE}"]
    assert (run.parent_id, run.span_id) == ("", _hex(machine_span_id(mid)))
    plan, build, ship = _of(spans, str(mid))
    assert [s.attributes["fsm.state"] for s in (plan, build, ship)] == ["PLAN", "BUILD", "SHIP"]
    for attempt in (plan, build, ship):
        assert attempt.parent_id == run.span_id
        assert attempt.span_id == _hex(attempt_span_id(mid, int(attempt.attributes["fsm.attempt"])))
        assert attempt.attributes["fsm.success"] is True

    children = [s for s in spans if s.name.startswith(f"machine {ROOT_TYPE}.BUILD.")]
    assert sorted(s.attributes["fsm.machine.type"] for s in children) == [
        f"{ROOT_TYPE}.BUILD.flaky",
        f"{ROOT_TYPE}.BUILD.steady",
    ]
    by_type = {s.attributes["fsm.machine.type"]: s for s in children}
    for child in children:
        assert child.parent_id == run.span_id  # a run within its parent's run
        assert child.attributes["fsm.status"] == "completed"
        for attempt in _of(spans, str(child.attributes["fsm.machine.id"])):
            assert attempt.parent_id == child.span_id
            # within the fan-out's attempt, from its entry to its join (to the millisecond
            # each end is recorded to)
            assert build.start_ns - 1_000_000 <= attempt.start_ns
            assert attempt.end_ns <= build.end_ns + 1_000_000

    flaky = _of(spans, str(by_type[f"{ROOT_TYPE}.BUILD.flaky"].attributes["fsm.machine.id"]))
    assert [s.attributes["fsm.state"] for s in flaky] == ["TRY", "TRY"]  # retried: twice
    first, second = flaky
    assert first.error and first.attributes["fsm.failure"] == "failure"
    assert first.attributes["fsm.outcome"] == "ack"
    assert not second.error and second.attributes["fsm.success"] is True
    (steady,) = _of(spans, str(by_type[f"{ROOT_TYPE}.BUILD.steady"].attributes["fsm.machine.id"]))
    assert steady.attributes["fsm.state"] == "WORK"

    # the agent handled each attempt under the attempt's span, named in its state_task
    attempts = {s.span_id: s for s in spans if s.name.startswith("state ")}
    handled = [s for s in spans if s.name.startswith("handle ")]
    assert {s.service for s in handled} == {"fsm-celery-agent"}
    assert sorted(attempts[h.parent_id].attributes["fsm.state"] for h in handled) == [
        "PLAN",
        "SHIP",
        "TRY",
        "TRY",
        "WORK",
    ]
    for h in handled:
        assert h.attributes["fsm.state"] == attempts[h.parent_id].attributes["fsm.state"]
    failed = [h for h in handled if h.error]
    assert [attempts[h.parent_id].span_id for h in failed] == [first.span_id]


@pytest.mark.parametrize("traced", ["celery"], indirect=True)  # inline: no enter_state
def test_the_celery_tasks_of_a_machine_join_its_trace(traced: FsmEnv, otlp: OtlpReceiver) -> None:
    mid = traced.client.start_machine(ROOT_TYPE, {})
    assert traced.wait_until_done(mid, timeout=60).status == "completed"
    trace = mid.hex
    # each process exports its spans in its own batches: a task's run may arrive before its publish
    everything = otlp.wait_for(_finished(trace, parents_of=("run/fsm.apply_acks",)))
    spans = [s for s in everything if s.trace_id == trace]
    attempts = {s.span_id: s for s in spans if s.name.startswith("state ")}
    # fsm.enter_state sent within the attempt it enters (a child's first, within its parent's
    # run): its publish and its run are spans of the machine's trace
    entered = [s for s in spans if s.name == "run/fsm.enter_state"]
    published = {s.span_id: s for s in spans if s.name == "apply_async/fsm.enter_state"}
    assert entered and all(s.parent_id in published for s in entered)
    states = {
        attempts[p.parent_id].attributes["fsm.state"]
        for p in published.values()
        if p.parent_id in attempts
    }
    assert {"BUILD", "SHIP", "TRY"} <= states  # the retry's entry too
    # the bridge sent each ack's fsm.apply_acks within the agent's span that sent the ack (the
    # state_ack's traceparent); an attempt decided by one links to its span
    by_id = {s.span_id: s for s in spans}
    relayed = [s for s in spans if s.name == "run/fsm.apply_acks"]
    assert relayed
    for task in relayed:
        publish, handle, attempt, *_ = _ancestors(task, by_id)
        assert publish == "apply_async/fsm.apply_acks"
        assert (handle.split()[0], attempt.split()[0]) == ("handle", "state")
    applied = {s.span_id for s in everything if s.name == "run/fsm.apply_acks"}
    assert not [s for s in everything if s.name.endswith("/fsm.scan")]  # beat's: left out
    assert all(
        set(a.links) & applied for a in attempts.values() if a.attributes["fsm.outcome"] == "ack"
    )


def _ancestors(span: Span, by_id: dict[str, Span]) -> list[str]:
    """The names of the span's parents, nearest first, as far as they were received."""
    names = []
    while span.parent_id in by_id:
        span = by_id[span.parent_id]
        names.append(span.name)
    return names


@pytest.mark.parametrize("traced", ["celery"], indirect=True)
def test_the_llm_agent_s_model_calls_nest_under_its_handling_of_the_attempt(
    traced: FsmEnv, otlp: OtlpReceiver
) -> None:
    roles = ("researcher", "analyzer", "reviewer")
    with Served(Script()) as served:
        agent = traced.start_agent(
            "--llm",
            *[flag for role in roles for flag in ("--agent-type", role)],
            extra_env={
                **otlp.environment(),
                "FSM_LLM_BASE_URL": served.url,
                "FSM_LLM_MODEL": "scripted-model",
            },
        )
        try:
            traced.wait_for_agents(1 + len(roles))
            context = pipeline_context(TaskState("edge caching strategies"))
            mid = traced.client.start_machine("research_pipeline", context)
            assert traced.wait_until_done(mid, timeout=90).status == "completed"
        finally:
            agent.kill(signal.SIGTERM)
    trace = mid.hex

    def done(spans: list[Span]) -> bool:
        return any(s.trace_id == trace and s.name == "machine research_pipeline" for s in spans)

    spans = [s for s in otlp.wait_for(done) if s.trace_id == trace]
    by_id = {s.span_id: s for s in spans}
    chats = [s for s in spans if s.name == "chat scripted-model"]
    assert chats and len(chats) == len([s for s in spans if s.name.startswith("handle ")])
    for chat in chats:
        handle, state, run = _ancestors(chat, by_id)
        assert handle.startswith("handle ") and state.startswith("state ")
        assert run == "machine research_pipeline"
        assert chat.attributes["gen_ai.request.model"] == "scripted-model"
        assert chat.attributes["gen_ai.usage.input_tokens"] > 0
        assert chat.attributes["gen_ai.usage.output_tokens"] > 0


@pytest.mark.parametrize("traced", ["celery"], indirect=True)
def test_a_tool_state_s_mcp_call_is_a_span_of_its_attempt(
    traced: FsmEnv, otlp: OtlpReceiver
) -> None:
    context = {"projectName": "sla-api", "githubIssue": 740, "key": "traced"}
    mid = traced.client.start_machine("test_tool", context)
    assert traced.wait_until_done(mid, timeout=90).status == "completed"
    trace = mid.hex

    def done(spans: list[Span]) -> bool:
        return any(s.trace_id == trace and s.name == "machine test_tool" for s in spans)

    spans = [s for s in otlp.wait_for(done) if s.trace_id == trace]
    by_id = {s.span_id: s for s in spans}
    calls = [s for s in spans if s.name.startswith("tools/call ")]
    states = {"run_tests": "RUN_TESTS", "flaky": "FLAKY", "echo": "ECHO"}
    assert sorted(s.attributes["gen_ai.tool.name"] for s in calls) == [
        "echo",
        "flaky",
        "flaky",  # failed the first time: retried
        "run_tests",
    ]
    for call in calls:
        assert call.attributes["mcp.server"] == "checks"
        assert _ancestors(call, by_id) == [
            "run/fsm.call_tool",
            "apply_async/fsm.call_tool",
            f"state {states[call.attributes['gen_ai.tool.name']]}",
            "machine test_tool",
        ]
    flaky = sorted((s for s in calls if s.name == "tools/call flaky"), key=lambda s: s.start_ns)
    assert [s.error for s in flaky] == [True, False]
