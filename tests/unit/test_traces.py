"""Traces' pure parts (the ids, the traceparent, the switch) and the spans made of a
transaction's decisions, on an in-memory exporter (fsm_celery.traces)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from types import SimpleNamespace
from typing import Any
from uuid import UUID

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON, Decision
from opentelemetry.trace import SpanKind, StatusCode

from fsm_celery import traces
from fsm_celery.agent.task import Task, sample_task
from fsm_celery.core.messages import StateEvent, parse_task_message
from fsm_celery.mcp.agent import HandOff
from fsm_celery.traces import wanted
from fsm_celery.traces.ids import (
    Parent,
    attempt_parent,
    attempt_span_id,
    machine_span_id,
    parse_traceparent,
    trace_id,
    traceparent,
    traceparent_in,
)
from fsm_celery.traces.live import HOUSEKEEPING, Live, _Ids, _Quiet
from fsm_celery.worker.app import app

ROOT = Path(__file__).resolve().parents[2]
MACHINE = UUID("5b1f0c1e-3f7a-4c55-9f0e-7d9f1b6e2a10")
CHILD = UUID("0d6f1c2e-8a4b-4f3e-9b1a-2c3d4e5f6a7b")
AT = datetime(2026, 11, 29, 5, 0, tzinfo=UTC)


def test_a_machine_s_trace_is_its_root_machine_s_id() -> None:
    assert trace_id(MACHINE) == MACHINE.int
    assert trace_id(CHILD, MACHINE) == MACHINE.int
    assert f"{trace_id(MACHINE):032x}" == MACHINE.hex  # as a trace viewer searches it


def test_an_attempt_s_span_id_is_the_same_wherever_it_is_derived_and_its_own() -> None:
    ids = {attempt_span_id(m, a) for m in (MACHINE, CHILD) for a in range(1, 50)}
    assert len(ids) == 98
    assert attempt_span_id(MACHINE, 3) == attempt_span_id(MACHINE, 3)
    assert machine_span_id(MACHINE) not in ids
    assert all(0 < i < 2**64 for i in ids | {machine_span_id(MACHINE)})


def test_a_traceparent_names_the_attempt_s_span_in_w3c_form() -> None:
    parent = attempt_parent(CHILD, MACHINE, 2)
    header = traceparent(parent)
    assert header == f"00-{MACHINE.hex}-{attempt_span_id(CHILD, 2):016x}-01"
    assert parse_traceparent(header) == parent
    assert parse_traceparent(header.upper()) == parent


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "00-abc-def-01",
        f"ff-{MACHINE.hex}-00f067aa0ba902b7-01",  # a version W3C forbids
        "00-00000000000000000000000000000000-00f067aa0ba902b7-01",  # no trace
        f"00-{MACHINE.hex}-0000000000000000-01",  # no span
        f"00-{MACHINE.hex}-00f067aa0ba902b7-01-extra",
    ],
)
def test_a_malformed_traceparent_names_no_span(header: str | None) -> None:
    assert parse_traceparent(header) is None


def test_an_ack_s_traceparent_is_found_without_parsing_it() -> None:
    header = traceparent(Parent(MACHINE.int, 77))
    ack = {"type": "state_ack", "machineId": str(MACHINE), "state": "S", "success": True}
    assert traceparent_in(json.dumps({**ack, "traceparent": header})) == Parent(MACHINE.int, 77)
    assert traceparent_in(json.dumps(ack)) is None
    assert traceparent_in(json.dumps({**ack, "traceparent": "00-nope"})) is None


def test_the_state_task_carries_the_traceparent_when_there_is_one() -> None:
    header = traceparent(attempt_parent(MACHINE, None, 1))
    raw = {
        "type": "state_task",
        "machineId": str(MACHINE),
        "machineType": "t",
        "state": "S",
        "attempt": 1,
        "context": {},
        "prompt": "p",
        "requiredOutput": [],
        "timeout": 1000,
        "deadline": AT.isoformat(),
        "taskToken": "x",
    }
    assert parse_task_message(json.dumps({**raw, "traceparent": header})).traceparent == header
    untraced = parse_task_message(json.dumps(raw))
    assert untraced.traceparent is None and "traceparent" not in untraced.to_wire()


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, False),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}, True),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://collector:4318/v1/traces"}, True),
        ({"OTEL_TRACES_EXPORTER": "otlp"}, True),
        ({"OTEL_TRACES_EXPORTER": "console"}, True),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, False),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp"}, False),
        ({"OTEL_SERVICE_NAME": "fsm"}, False),
    ],
)
def test_traces_are_on_only_when_the_environment_asks(environ: dict[str, str], on: bool) -> None:
    assert wanted(environ) is on


def test_off_nothing_imports_the_opentelemetry_sdk() -> None:
    # its tracing part: redis-py 8 imports the SDK's metrics itself when they are installed
    script = """
import sys, uuid
from fsm_celery import traces, wiring
from fsm_celery.agent import llm, sdk
from fsm_celery.engine import Step
step = Step(uuid.uuid4(), 1)
assert traces.traceparent_for(step.machine_id, None, 1) is None
assert traces.handled(None, "t", lambda: 3) == 3
with traces.entering(step), traces.model_call("m") as m, traces.tool_call("s", "t") as t:
    m(None); t(None)
ours = ("opentelemetry.sdk.trace", "opentelemetry.exporter", "opentelemetry.instrumentation")
print(sorted(n for n in sys.modules if n.startswith((*ours, "fsm_celery.traces.live"))))
"""
    environ = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_")}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=environ, capture_output=True, text=True
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@dataclass
class Row:
    machine_id: UUID
    attempt: int
    event: str
    failure: str | None = None
    correction: int = 0
    machine_created_at: datetime = AT - timedelta(seconds=10)


@dataclass
class Writes:
    events: list[StateEvent]
    history: list[Row] = field(default_factory=list)

    @property
    def out(self) -> Any:
        return SimpleNamespace(events=self.events)


def _event(machine: UUID, attempt: int, **fields: Any) -> StateEvent:
    base: dict[str, Any] = {
        "machine_id": machine,
        "machine_type": "t",
        "agent_type": "tester",
        "agent_id": None,
        "parent_id": None,
        "root_id": None,
        "event": "ack",
        "from_state": "WORK",
        "to_state": "DONE",
        "status": "running",
        "attempt": attempt,
        "success": True,
        "error": None,
        "duration_ms": 1500,
        "at": AT,
    }
    return StateEvent.model_construct(**{**base, **fields})


@pytest.fixture
def live() -> tuple[Live, InMemorySpanExporter]:
    exported = InMemorySpanExporter()
    ids = _Ids()
    provider = TracerProvider(id_generator=ids)
    provider.add_span_processor(SimpleSpanProcessor(exported))
    return Live(provider, ids), exported


def test_a_decided_attempt_is_a_span_from_its_entry_to_its_decision(
    live: tuple[Live, InMemorySpanExporter],
) -> None:
    tracer, exported = live
    failed = _event(CHILD, 4, root_id=MACHINE, parent_id=MACHINE, success=False, error="boom")
    tracer.decided(Writes([failed], [Row(CHILD, 4, "ack", failure="failure")]))
    (span,) = exported.get_finished_spans()
    context = span.get_span_context()
    assert (context.trace_id, context.span_id) == (MACHINE.int, attempt_span_id(CHILD, 4))
    assert span.parent is not None and span.parent.span_id == machine_span_id(CHILD)
    assert span.end_time == int(AT.timestamp() * 1e9)
    assert span.start_time == span.end_time - 1_500_000_000
    assert span.attributes is not None
    assert span.attributes["fsm.failure"] == "failure"
    assert (span.attributes["fsm.state"], span.attributes["fsm.attempt"]) == ("WORK", 4)
    assert span.status.status_code is StatusCode.ERROR


def test_a_start_and_a_refused_answer_decide_no_attempt(
    live: tuple[Live, InMemorySpanExporter],
) -> None:
    tracer, exported = live
    start = _event(MACHINE, 0, event="start", from_state=None, duration_ms=None)
    refused = _event(MACHINE, 1, success=False, to_state="WORK")
    answered = _event(MACHINE, 1)
    history = [Row(MACHINE, 1, "ack", correction=1), Row(MACHINE, 1, "ack")]
    tracer.decided(Writes([start, refused, answered], history))
    (span,) = exported.get_finished_spans()
    assert span.status.status_code is StatusCode.UNSET  # the answer that decided it


def test_an_ended_machine_is_a_span_of_its_run_under_its_parent_s(
    live: tuple[Live, InMemorySpanExporter],
) -> None:
    tracer, exported = live
    ended = _event(CHILD, 2, root_id=MACHINE, parent_id=MACHINE, status="completed")
    root = _event(MACHINE, 3, status="failed", success=False, error="no")
    history = [Row(CHILD, 2, "ack"), Row(MACHINE, 3, "ack")]
    tracer.decided(Writes([ended, root], history))
    spans = [s for s in exported.get_finished_spans() if s.name == "machine t"]
    child, top = sorted(spans, key=lambda s: s.parent is None)
    assert child.parent is not None and child.parent.span_id == machine_span_id(MACHINE)
    assert child.get_span_context().span_id == machine_span_id(CHILD)
    assert top.parent is None  # the root span of the trace named after it
    assert top.get_span_context().trace_id == MACHINE.int
    assert top.start_time == int((AT - timedelta(seconds=10)).timestamp() * 1e9)
    assert top.status.status_code is StatusCode.ERROR


def test_an_agent_s_handling_and_its_model_call_nest_under_the_attempt(
    live: tuple[Live, InMemorySpanExporter],
) -> None:
    tracer, exported = live
    task = SimpleNamespace(
        machine_id=CHILD,
        machine_type="t",
        state="WORK",
        attempt=2,
        traceparent=traceparent(attempt_parent(CHILD, MACHINE, 2)),
    )
    usage = SimpleNamespace(prompt_tokens=12, completion_tokens=5)
    with tracer.handling(task, "tester") as answered:
        with tracer.model_call("gpt-x", "openai") as completed:
            completed(SimpleNamespace(model="gpt-x-1", usage=usage))
        reply = {"type": "state_ack", "success": False, "error": "no"}
        answered(reply)
    chat, handled = exported.get_finished_spans()
    here = handled.get_span_context()
    assert reply["traceparent"] == traceparent(Parent(here.trace_id, here.span_id))  # for the ack
    assert handled.parent is not None and handled.parent.span_id == attempt_span_id(CHILD, 2)
    assert handled.get_span_context().trace_id == MACHINE.int
    assert handled.kind is SpanKind.CONSUMER
    assert handled.status.status_code is StatusCode.ERROR
    assert chat.parent is not None and chat.parent.span_id == handled.get_span_context().span_id
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.usage.input_tokens"] == 12
    assert chat.attributes["gen_ai.usage.output_tokens"] == 5
    assert chat.attributes["gen_ai.response.model"] == "gpt-x-1"


def test_a_task_sent_within_an_attempt_names_it_as_parent(
    live: tuple[Live, InMemorySpanExporter],
) -> None:
    tracer, exported = live
    with tracer.within(Parent(MACHINE.int, attempt_span_id(MACHINE, 1))), tracer.span("sent", {}):
        pass
    (span,) = exported.get_finished_spans()
    assert span.parent is not None and span.parent.span_id == attempt_span_id(MACHINE, 1)
    assert span.get_span_context().trace_id == MACHINE.int


def test_beat_s_periodic_tasks_make_no_celery_spans() -> None:
    assert {entry["task"] for entry in app.conf.beat_schedule.values()} == HOUSEKEEPING
    quiet = _Quiet(ALWAYS_ON)
    for name in ("run/fsm.scan", "apply_async/fsm.scan", "run/fsm.prune"):
        assert quiet.should_sample(None, 1, name).decision is Decision.DROP
    for name in ("run/fsm.enter_state", "apply_async/fsm.apply_acks", "state WORK"):
        assert quiet.should_sample(None, 1, name).decision is Decision.RECORD_AND_SAMPLE


def test_the_mcp_door_s_task_is_a_span_under_the_sdk_s_handling(
    live: tuple[Live, InMemorySpanExporter], monkeypatch: pytest.MonkeyPatch
) -> None:
    tracer, exported = live
    monkeypatch.setattr(traces, "_live", tracer)
    monkeypatch.setattr(traces, "_decided", True)
    handoff = HandOff()
    message = sample_task("t", "WORK", {})

    def session() -> None:  # an MCP client's next_task, then submit
        held = handoff.take(5)
        assert held is not None
        held.answer("submit", {"done": True})

    threading.Thread(target=session).start()
    output = traces.handled(message, "t", lambda: handoff.handle(Task(message, lambda _: None)))
    assert output == {"done": True}
    door, handled = exported.get_finished_spans()
    assert (door.name, handled.name) == ("mcp agent task", "handle WORK")
    assert door.parent is not None and door.parent.span_id == handled.get_span_context().span_id
