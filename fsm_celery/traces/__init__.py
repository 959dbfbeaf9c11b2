"""OpenTelemetry traces of machines, from the engine to the agent's model and tool calls
(docs/operations.md, "Traces").

Off unless the standard environment asks for them: OTEL_TRACES_EXPORTER (`otlp`, over
HTTP/protobuf, or `console`), or, that unset, OTEL_EXPORTER_OTLP_ENDPOINT or
OTEL_EXPORTER_OTLP_TRACES_ENDPOINT; OTEL_SDK_DISABLED=true or OTEL_TRACES_EXPORTER=none keeps
them off. Off, every function here is a check of one global and nothing imports OpenTelemetry
(the `otel` extra); on, the work is in fsm_celery.traces.live, set up once a process, as the
service its entry point names (`start`), or "fsm-celery" for one that named none.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any, Protocol, TypeVar
from uuid import UUID

from fsm_celery.traces.ids import Parent as Parent
from fsm_celery.traces.ids import (
    attempt_parent,
    machine_span_id,
    trace_id,
    traceparent,
    traceparent_in,
)

if TYPE_CHECKING:
    from fsm_celery.traces.live import Answered, Decided, Live

log = logging.getLogger(__name__)
R = TypeVar("R")

_OFF: AbstractContextManager[None] = nullcontext()
_live: Live | None = None
_decided = False  # whether this process looked at its environment yet
_deciding = threading.Lock()  # agents of one process start on threads of their own


class Raw(Protocol):
    @property
    def raw(self) -> str: ...


class Relayed(Protocol):
    """An agent's message as the bridge relays it (fsm_celery.acks.consumer.Envelope)."""

    @property
    def item(self) -> Raw: ...


class Entering(Protocol):
    """A state about to be entered (fsm_celery.core.steps.Step has it)."""

    @property
    def machine_id(self) -> UUID: ...
    @property
    def attempt(self) -> int: ...
    @property
    def root_id(self) -> UUID | None: ...


def wanted(environ: Mapping[str, str] = os.environ) -> bool:
    """Whether the environment asks for traces."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exporter = environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if exporter:
        return exporter != "none"
    endpoints = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
    return any(environ.get(name, "").strip() for name in endpoints)


def start(service: str) -> bool:
    """Trace this process as `service` (OTEL_SERVICE_NAME wins) if the environment asks for
    traces, once (a later call keeps the first name); whether it is traced."""
    global _live, _decided
    with _deciding:
        if not _decided:
            _live = _setup(service) if wanted() else None
            _decided = True
    return _live is not None


def _setup(service: str) -> Live | None:
    try:
        from fsm_celery.traces.live import setup
    except ImportError as exc:
        log.warning("OTEL_* asks for traces, but %s: pip install 'fsm-celery[otel]'", exc)
        return None
    return setup(service)


def _on() -> Live | None:
    if not _decided:
        start("fsm-celery")
    return _live


def traceparent_for(machine_id: UUID, root_id: UUID | None, attempt: int) -> str | None:
    """The W3C traceparent of a machine's attempt, for its state_task; None when off."""
    if _on() is None:
        return None
    return traceparent(attempt_parent(machine_id, root_id, attempt))


def decided(writes: Decided) -> None:
    """The spans of the attempts a committed transaction decided, and of the machines it ended."""
    live = _on()
    if live is not None:
        try:
            live.decided(writes)
        except Exception:  # committed already: a span is never worth failing a transaction
            log.warning("the spans of a transaction's decisions could not be made", exc_info=True)


def entering(step: Entering) -> AbstractContextManager[Any]:
    """Where a task that enters (or calls the tool of) a step is sent from: within its
    attempt's span, so that its Celery spans join the machine's trace."""
    live = _on()
    if live is None:
        return _OFF
    return live.within(attempt_parent(step.machine_id, step.root_id, step.attempt))


def relaying(batch: Iterable[Relayed]) -> AbstractContextManager[Any]:
    """Where the bridge sends an fsm.apply_acks task from: within the span of the agent that
    sent the first of its messages to name one (its traceparent), else where it is."""
    live = _on()
    if live is None:
        return _OFF
    for envelope in batch:
        parent = traceparent_in(envelope.item.raw)
        if parent is not None:
            return live.within(parent)
    return _OFF


def starting_children(parent_id: UUID, root_id: UUID | None) -> AbstractContextManager[Any]:
    """Where a fan-out's children's first entries are sent from: within their parent's run."""
    live = _on()
    if live is None:
        return _OFF
    return live.within(Parent(trace_id(parent_id, root_id), machine_span_id(parent_id)))


@contextmanager
def _no_answer() -> Iterator[Answered]:
    yield _ignore


def _ignore(reply: Mapping[str, Any] | None) -> None:
    return None


def handled(task: Any, agent_type: str, work: Callable[[], R]) -> R:
    """work(): an agent's handling of a state_task (a core.messages.StateTask), its reply;
    traced, within a span under the attempt's that the task's traceparent names."""
    live = _on()
    if live is None:
        return work()
    with live.handling(task, agent_type) as answered:
        reply = work()
        answered(reply)
        return reply


def model_call(model: str, system: str = "openai") -> AbstractContextManager[Any]:
    """A chat completion: what it yields is told the response (its model and token usage)."""
    live = _on()
    if live is None:
        return _no_answer()
    return live.model_call(model, system)


def tool_call(server: str, tool: str) -> AbstractContextManager[Any]:
    """A call to one tool of an MCP server: what it yields is told the outcome's error."""
    live = _on()
    if live is None:
        return _no_answer()
    return live.tool_call(server, tool)


def span(name: str, **attributes: str | int) -> AbstractContextManager[Any]:
    """A span of the current trace (none when off)."""
    live = _on()
    if live is None:
        return _OFF
    return live.span(name, attributes)
