"""The traces themselves, on the OpenTelemetry SDK (the `otel` extra): imported only once
OTEL_* asks for traces (fsm_celery.traces).

A machine's attempts become spans when they are decided, in whichever process decides them,
with their entry as start time and the ids fsm_celery.traces.ids derives, so that what was
sent for an attempt before (its state_task's traceparent, its Celery tasks' headers) names
them as parent: the SDK's tracer takes its ids from `_Ids`, told them for that one span.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import defaultdict, deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime
from typing import Any, Protocol
from uuid import UUID

from opentelemetry import context, trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.instrumentation.celery import CeleryInstrumentor
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
from opentelemetry.sdk.trace.id_generator import IdGenerator, RandomIdGenerator
from opentelemetry.sdk.trace.sampling import Decision, Sampler, SamplingResult
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    Span,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
)

from fsm_celery.traces.ids import (
    Parent,
    attempt_span_id,
    machine_span_id,
    parse_traceparent,
    trace_id,
    traceparent,
)

log = logging.getLogger(__name__)

SCOPE = "fsm_celery"
ENDED = ("completed", "failed", "cancelled")  # a machine's statuses once its run is over
# beat's periodic tasks (celeryconfig.beat_schedule): several a second, forever; their Celery
# spans are left out (what they decide is traced all the same, in the machines' traces)
HOUSEKEEPING = frozenset(
    {"fsm.scan", "fsm.run_schedules", "fsm.fold_stats", "fsm.notify", "fsm.prune", "fsm.history"}
)
Answered = Callable[[Any], None]


class Event(Protocol):
    """What a span of an attempt is made of: a committed transition's event
    (fsm_celery.core.messages.StateEvent)."""

    machine_id: UUID
    machine_type: str
    agent_type: str
    agent_id: UUID | None
    parent_id: UUID | None
    root_id: UUID | None
    event: str
    from_state: str | None
    to_state: str
    status: str
    attempt: int
    success: bool
    error: str | None
    duration_ms: int | None
    at: datetime


class Row(Protocol):
    """A history row (fsm_celery.store.rows.History): what the event does not carry."""

    machine_id: UUID
    attempt: int
    event: str
    failure: str | None
    correction: int
    machine_created_at: datetime


class Out(Protocol):
    @property
    def events(self) -> Iterable[Event]: ...


class Decided(Protocol):
    """A committed transaction's writes (fsm_celery.store.writes.Writes)."""

    @property
    def out(self) -> Out: ...


class _Ids(IdGenerator):
    """Random ids, but those it is told for the next span started on this thread."""

    def __init__(self) -> None:
        self._random = RandomIdGenerator()
        self._told = threading.local()

    @contextmanager
    def told(self, trace: int | None, span: int) -> Iterator[None]:
        self._told.ids = (trace, span)
        try:
            yield
        finally:
            self._told.ids = None

    def generate_trace_id(self) -> int:
        ids = getattr(self._told, "ids", None)
        return ids[0] if ids is not None and ids[0] else self._random.generate_trace_id()

    def generate_span_id(self) -> int:
        ids = getattr(self._told, "ids", None)
        return ids[1] if ids is not None else self._random.generate_span_id()


class _Quiet(Sampler):
    """The sampler OTEL_TRACES_SAMPLER names, but for the Celery spans of beat's tasks."""

    def __init__(self, inner: Sampler) -> None:
        self._inner = inner

    def should_sample(
        self,
        parent_context: context.Context | None,
        trace_id: int,
        name: str,
        kind: SpanKind | None = None,
        attributes: Any = None,
        links: Any = None,
        trace_state: Any = None,
    ) -> SamplingResult:
        if name.partition("/")[2] in HOUSEKEEPING:
            return SamplingResult(Decision.DROP)
        return self._inner.should_sample(
            parent_context, trace_id, name, kind, attributes, links, trace_state
        )

    def get_description(self) -> str:
        return f"Quiet{{{self._inner.get_description()}}}"


def _exporters() -> list[SpanExporter]:
    names = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower() or "otlp"
    exporters: list[SpanExporter] = []
    for name in filter(None, (n.strip() for n in names.split(","))):
        if name == "console":
            exporters.append(ConsoleSpanExporter(out=sys.stderr))  # stdout: an MCP door's
        elif name == "otlp":
            exporters.append(OTLPSpanExporter())  # reads OTEL_EXPORTER_OTLP_* itself
        else:
            log.warning("OTEL_TRACES_EXPORTER %r: only otlp (HTTP/protobuf) and console", name)
    return exporters


def setup(service: str) -> Live:
    """The process's tracer provider (OTEL_* read by the SDK: sampler, batch sizes, endpoint,
    headers, resource attributes), set as the global one, and its Celery tasks traced."""
    ids = _Ids()
    name = os.environ.get("OTEL_SERVICE_NAME", "").strip() or service
    provider = TracerProvider(
        sampler=_Quiet(TracerProvider(shutdown_on_exit=False).sampler),  # OTEL_TRACES_SAMPLER's
        resource=Resource.create({SERVICE_NAME: name}),
        id_generator=ids,
    )
    for exporter in _exporters():
        provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    CeleryInstrumentor().instrument(tracer_provider=provider)  # type: ignore[no-untyped-call]
    return Live(provider, ids)


def _ns(at: datetime) -> int:
    return int(at.timestamp() * 1_000_000_000)


def _remote(parent: Parent) -> context.Context:
    """A context whose current span is the one named, made elsewhere."""
    named = SpanContext(parent.trace_id, parent.span_id, True, TraceFlags(parent.flags))
    return trace.set_span_in_context(NonRecordingSpan(named), context.Context())


class Live:
    def __init__(self, provider: TracerProvider, ids: _Ids) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer(SCOPE)
        self._ids = ids

    def decided(self, writes: Decided) -> None:
        """A span for each attempt the transaction decided (an answer refused within its
        attempt decides nothing), and one for each machine it ended; each linked to the span
        it was decided in (the fsm.apply_acks task that applied its ack, for one)."""
        rows: dict[tuple[UUID, int, str], deque[Row]] = defaultdict(deque)
        for row in getattr(writes, "history", ()):
            rows[(row.machine_id, row.attempt, row.event)].append(row)
        here = trace.get_current_span().get_span_context()
        links = [Link(here)] if here.is_valid and here.trace_flags.sampled else []
        for event in writes.out.events:
            if event.event == "start":
                continue
            found = rows.get((event.machine_id, event.attempt, event.event))
            row = found.popleft() if found else None
            if row is not None and row.correction:
                continue
            if event.duration_ms is not None:
                self._attempt(event, row, links)
            if event.status in ENDED:
                self._machine(event, row)

    def _attempt(self, event: Event, row: Row | None, links: list[Link]) -> None:
        end = _ns(event.at)
        start = end - (event.duration_ms or 0) * 1_000_000
        trace = trace_id(event.machine_id, event.root_id)
        parent = _remote(Parent(trace, machine_span_id(event.machine_id)))
        attributes: dict[str, str | int | bool] = {
            "fsm.machine.id": str(event.machine_id),
            "fsm.machine.type": event.machine_type,
            "fsm.state": event.from_state or event.to_state,
            "fsm.attempt": event.attempt,
            "fsm.outcome": event.event,
            "fsm.success": event.success,
            "fsm.to_state": event.to_state,
            "fsm.agent.type": event.agent_type,
        }
        if event.agent_id is not None:
            attributes["fsm.agent.id"] = str(event.agent_id)
        if row is not None and row.failure:
            attributes["fsm.failure"] = row.failure
        with self._ids.told(None, attempt_span_id(event.machine_id, event.attempt)):
            span = self.tracer.start_span(
                f"state {attributes['fsm.state']}",
                parent,
                attributes=attributes,
                links=links,
                start_time=start,
            )
        if not event.success:
            span.set_status(Status(StatusCode.ERROR, event.error or event.event))
        span.end(end)

    def _machine(self, event: Event, row: Row | None) -> None:
        end = _ns(event.at)
        trace = trace_id(event.machine_id, event.root_id)
        attributes: dict[str, str] = {
            "fsm.machine.id": str(event.machine_id),
            "fsm.machine.type": event.machine_type,
            "fsm.status": event.status,
        }
        parent = context.Context()  # a root machine's run: the root span of its trace
        if event.parent_id is not None:
            attributes["fsm.parent.id"] = str(event.parent_id)
            parent = _remote(Parent(trace, machine_span_id(event.parent_id)))
        with self._ids.told(trace, machine_span_id(event.machine_id)):
            span = self.tracer.start_span(
                f"machine {event.machine_type}",
                parent,
                attributes=attributes,
                start_time=_ns(row.machine_created_at) if row is not None else end,
            )
        if event.status != "completed":
            span.set_status(Status(StatusCode.ERROR, event.error or event.status))
        span.end(end)

    @contextmanager
    def within(self, parent: Parent) -> Iterator[None]:
        token = context.attach(_remote(parent))
        try:
            yield
        finally:
            context.detach(token)

    @contextmanager
    def handling(self, task: Any, agent_type: str) -> Iterator[Answered]:
        named = parse_traceparent(getattr(task, "traceparent", None))
        attributes = {
            "fsm.machine.id": str(task.machine_id),
            "fsm.machine.type": task.machine_type,
            "fsm.state": task.state,
            "fsm.attempt": task.attempt,
            "fsm.agent.type": agent_type,
        }
        with self.tracer.start_as_current_span(
            f"handle {task.state}",
            _remote(named) if named is not None else context.Context(),
            SpanKind.CONSUMER,
            attributes,
        ) as span:
            yield lambda reply: _answered(span, reply)

    @contextmanager
    def model_call(self, model: str, system: str) -> Iterator[Answered]:
        attributes = {
            "gen_ai.operation.name": "chat",
            "gen_ai.system": system,
            "gen_ai.request.model": model,
        }
        with self.tracer.start_as_current_span(
            f"chat {model}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            yield lambda response: _completed(span, response)

    @contextmanager
    def tool_call(self, server: str, tool: str) -> Iterator[Answered]:
        attributes = {"mcp.server": server, "gen_ai.tool.name": tool, "mcp.method": "tools/call"}
        with self.tracer.start_as_current_span(
            f"tools/call {tool}", kind=SpanKind.CLIENT, attributes=attributes
        ) as span:
            yield lambda error: _failed(span, error)

    def span(self, name: str, attributes: Mapping[str, str | int]) -> AbstractContextManager[Span]:
        return self.tracer.start_as_current_span(name, attributes=attributes)


def _answered(span: Span, reply: Mapping[str, Any] | None) -> None:
    """The handler's reply on its span: the message sent, and its error; an ack names the span
    (its traceparent), for the task that applies it to be traced under it."""
    if reply is None:
        span.set_attribute("fsm.reply", "none")
        return
    if isinstance(reply, dict) and reply.get("type") == "state_ack":
        here = span.get_span_context()
        reply["traceparent"] = traceparent(Parent(here.trace_id, here.span_id, here.trace_flags))
    span.set_attribute("fsm.reply", str(reply.get("type")))
    if reply.get("type") == "state_ack":
        span.set_attribute("fsm.success", bool(reply.get("success")))
    if reply.get("success") is False:
        span.set_status(Status(StatusCode.ERROR, str(reply.get("error") or "failed")))


def _completed(span: Span, response: Any) -> None:
    """A chat completion's model and token usage on its span (GenAI semantic conventions)."""
    model = getattr(response, "model", None)
    if isinstance(model, str):
        span.set_attribute("gen_ai.response.model", model)
    usage = getattr(response, "usage", None)
    if usage is not None:
        span.set_attribute("gen_ai.usage.input_tokens", int(usage.prompt_tokens or 0))
        span.set_attribute("gen_ai.usage.output_tokens", int(usage.completion_tokens or 0))


def _failed(span: Span, error: str | None) -> None:
    if error:
        span.set_status(Status(StatusCode.ERROR, error))
