"""Machine definitions: states, edges, and the static validator."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from datetime import datetime, timedelta
from enum import StrEnum
from functools import lru_cache
from typing import Any, Literal

import jinja2
import jmespath
import jmespath.exceptions
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator

from fsm_celery.core.context import context_problem, schema_problem
from fsm_celery.core.prompt import TEMPLATES, variables
from fsm_celery.core.schedule import Schedule
from fsm_celery.core.usage import Budget
from fsm_celery.exceptions import DefinitionError, Problem

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_]*$"


class Terminal(StrEnum):
    """How a machine ends when it enters a terminal state."""

    COMPLETED = "completed"
    FAILED = "failed"


class FailureKind(StrEnum):
    """Why an attempt failed."""

    FAILURE = "failure"  # the agent acked with success: false
    TIMEOUT = "timeout"  # no ack before the deadline
    INVALID_OUTPUT = "invalid_output"  # success, but required output keys are missing
    DISPATCH = "dispatch"  # the state could not be sent (its prompt failed to render); not retried


RETRYABLE = (FailureKind.FAILURE, FailureKind.TIMEOUT, FailureKind.INVALID_OUTPUT)


class Jitter(StrEnum):
    """How a retry delay is randomised (as Step Functions' JitterStrategy)."""

    FULL = "full"  # anywhere between 0 and the computed delay
    NONE = "none"


class Backoff(BaseModel):
    """The wait before each retry: delay * rate ** (retry - 1), capped at max_delay."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    delay: timedelta = timedelta(seconds=1)
    rate: float = Field(default=2.0, ge=1.0)
    max_delay: timedelta = timedelta(minutes=5)
    jitter: Jitter = Jitter.FULL


class Edge(BaseModel):
    """A way out of a state: a target, an optional guard, and whether it counts as a loop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    when: str | None = None
    loop: bool = False


def _edge(value: Any) -> Any:
    return {"target": value} if isinstance(value, str) else value


class StateDefinition(BaseModel):
    """One state: what the agent is told, what it must return, and where to go next."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(max_length=50, pattern=NAME_PATTERN)
    description: str = ""
    prompt: str = ""
    required_output: tuple[str, ...] = ()
    on_success: tuple[Edge, ...] = ()
    on_failure: Edge | None = None
    timeout: timedelta = timedelta(minutes=5)
    heartbeat_timeout: timedelta | None = None
    max_duration: timedelta | None = None  # an attempt's limit however many heartbeats arrive
    max_retries: int = Field(default=0, ge=0)
    retry_on: tuple[FailureKind, ...] = RETRYABLE
    backoff: Backoff = Backoff()
    terminal: Terminal | None = None

    @field_validator("on_success", mode="before")
    @classmethod
    def _success_edges(cls, value: Any) -> Any:
        if isinstance(value, str | dict):
            return [_edge(value)]
        return [_edge(v) for v in value] if isinstance(value, list) else value

    @field_validator("on_failure", mode="before")
    @classmethod
    def _failure_edge(cls, value: Any) -> Any:
        return _edge(value)

    @field_validator("retry_on")
    @classmethod
    def _retryable(cls, value: tuple[FailureKind, ...]) -> tuple[FailureKind, ...]:
        if FailureKind.DISPATCH in value:
            raise ValueError("a dispatch failure is not retried: it would fail the same way")
        return value

    @property
    def edges(self) -> tuple[Edge, ...]:
        return self.on_success + ((self.on_failure,) if self.on_failure else ())

    @property
    def timeout_seconds(self) -> float:
        return self.timeout.total_seconds()

    @property
    def heartbeat_window(self) -> timedelta:
        """How long an agent that sent a heartbeat may stay silent before it times out."""
        return self.heartbeat_timeout if self.heartbeat_timeout is not None else self.timeout

    def heartbeat_deadline(
        self, entered_at: datetime, now: datetime, default_max: timedelta
    ) -> datetime:
        """The deadline a heartbeat at `now` sets: a window from now, but never past the
        attempt's longest duration (nor before its plain timeout)."""
        longest = max(self.max_duration or default_max, self.timeout)
        return min(now + self.heartbeat_window, entered_at + longest)


class Notify(BaseModel):
    """Where to POST when a machine of the type ends, and for which endings."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(max_length=2000, pattern=r"^https?://[^\s]+$")
    on: tuple[Literal["completed", "failed", "cancelled"], ...] = (
        "completed",
        "failed",
        "cancelled",
    )


class MachineDefinition(BaseModel):
    """A machine type: its agent type, its states and its initial state."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    type: str = Field(max_length=50, pattern=NAME_PATTERN)
    agent_type: str = Field(max_length=10, min_length=1)
    description: str = ""
    initial_state: str
    max_loops: int = Field(default=3, ge=0)
    budget: Budget | None = None
    on_loop_exhausted: str = "FAILED"
    states: tuple[StateDefinition, ...] = Field(min_length=1)
    # beat starts a machine of the type on each (fsm_celery.core.schedule)
    schedules: tuple[Schedule, ...] = Field(default=(), max_length=20)
    # an outgoing webhook when a machine ends (fsm_celery.core.notify), besides FSM_NOTIFY_URL
    notify: Notify | None = None
    # the JSON Schema a starting context must match (fsm_celery.core.context); None: any object
    context_schema: dict[str, Any] | None = None

    _by_name: dict[str, StateDefinition] = PrivateAttr(default_factory=dict)

    def model_post_init(self, context: Any, /) -> None:
        self._by_name = {s.name: s for s in self.states}

    def state(self, name: str) -> StateDefinition:
        """The state called name (KeyError if there is none)."""
        return self._by_name[name]

    def step_bound(self) -> int:
        """The most transitions a run can take: each loop pass visits each state, retries too."""
        visits = sum(s.max_retries + 1 for s in self.states if s.terminal is None)
        return (self.max_loops + 2) * visits

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form that loads back to an equal definition."""
        return self.model_dump(mode="json", exclude_defaults=True)

    def digest(self) -> str:
        """A hash of the content, so a reload of an unchanged file makes no new version."""
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


@lru_cache(maxsize=4096)
def compile_guard(expression: str) -> Any:
    """A compiled JMESPath guard (raises jmespath's ParseError when it does not compile)."""
    return jmespath.compile(expression)


def validate(definition: MachineDefinition, source: str = "<definition>") -> None:
    """Raise DefinitionError listing every structural problem of the definition."""
    problems = list(_problems(definition, source))
    if problems:
        raise DefinitionError(problems)


def _problems(d: MachineDefinition, source: str) -> Iterator[Problem]:
    names = [s.name for s in d.states]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            yield Problem(f"duplicate state name {name!r}", source, name, "name")
        seen.add(name)
    schedules = [s.name for s in d.schedules]
    for i, name in enumerate(schedules):
        if name in schedules[:i]:
            yield Problem(f"duplicate schedule name {name!r}", source, None, "schedules")
    if d.initial_state not in seen:
        yield Problem(
            f"initial state {d.initial_state!r} is not one of the states",
            source,
            None,
            "initial_state",
        )
    if (
        _has_loops(d)
        and d.on_loop_exhausted in seen
        and d.state(d.on_loop_exhausted).terminal is None
    ):
        yield Problem(
            f"on_loop_exhausted must be a terminal state, {d.on_loop_exhausted!r} is not: "
            "a machine past its loop bound would loop on",
            source,
            None,
            "on_loop_exhausted",
        )
    if _has_loops(d) and d.on_loop_exhausted not in seen:
        yield Problem(
            f"target {d.on_loop_exhausted!r} is not one of the states",
            source,
            None,
            "on_loop_exhausted",
        )
    for state in d.states:
        yield from _state_problems(state, seen, source)
    known = not any(p for p in _edge_targets_unknown(d, seen))
    if known:  # else graph checks would only repeat the unknown targets
        yield from _graph_problems(d, source)
    yield from _context_problems(d, source, known)


def _edge_targets_unknown(d: MachineDefinition, names: set[str]) -> Iterator[str]:
    for state in d.states:
        for edge in state.edges:
            if edge.target not in names:
                yield edge.target
    if d.initial_state not in names:
        yield d.initial_state
    if _has_loops(d) and d.on_loop_exhausted not in names:
        yield d.on_loop_exhausted


def _has_loops(d: MachineDefinition) -> bool:
    return any(edge.loop for state in d.states for edge in state.edges)


# The longest a state's timeout, heartbeat window, max_duration or retry delay may be: an attempt
# that waits longer is a schedule or an approval, not an agent's work. Versions stored before the
# bound are read as they were checked then (fsm_celery.store.queries).
LONGEST_WAIT = timedelta(days=30)


def _too_long(state: StateDefinition) -> Iterator[str]:
    waits = {
        "timeout": state.timeout,
        "heartbeat_timeout": state.heartbeat_timeout,
        "max_duration": state.max_duration,
        "backoff": state.backoff.max_delay,
    }
    for field, wait in waits.items():
        if wait is not None and wait > LONGEST_WAIT:
            yield field


def _timing_problems(state: StateDefinition, source: str) -> Iterator[Problem]:
    name = state.name
    for field in _too_long(state):
        yield Problem(f"{field} must be at most 30 days (2592000s)", source, name, field)
    if state.timeout <= timedelta(0):
        yield Problem(
            f"timeout must be positive, got {state.timeout_seconds:g}s", source, name, "timeout"
        )
    if state.heartbeat_timeout is not None and state.heartbeat_timeout <= timedelta(0):
        yield Problem("heartbeat_timeout must be positive", source, name, "heartbeat_timeout")
    if state.max_duration is not None and state.max_duration < state.timeout:
        yield Problem("max_duration must be at least timeout", source, name, "max_duration")
    if state.backoff.delay < timedelta(0) or state.backoff.max_delay < state.backoff.delay:
        yield Problem("backoff needs 0 <= delay <= max_delay", source, name, "backoff")


def _state_problems(state: StateDefinition, names: set[str], source: str) -> Iterator[Problem]:
    name = state.name
    yield from _timing_problems(state, source)
    if state.terminal is not None:
        if state.edges:
            field = "on_success" if state.on_success else "on_failure"
            yield Problem("a terminal state has no edges", source, name, field)
        return
    if not state.on_success:
        yield Problem("a non-terminal state needs on_success", source, name, "on_success")
    if state.on_failure is None:
        yield Problem("a non-terminal state needs on_failure", source, name, "on_failure")
    yield from _edge_problems(state, names, source)
    if state.on_failure is not None and state.on_failure.when is not None:
        yield Problem("a failure edge takes no guard (when:)", source, name, "on_failure")
    if state.on_success and state.on_success[-1].when is not None:
        yield Problem(
            "the last on_success edge must have no guard (it is the default)",
            source,
            name,
            "on_success",
        )
    try:
        TEMPLATES.parse(state.prompt)
    except jinja2.TemplateSyntaxError as exc:
        yield Problem(f"prompt template does not compile: {exc}", source, name, "prompt")


def _edge_problems(state: StateDefinition, names: set[str], source: str) -> Iterator[Problem]:
    for field, edge in _labelled_edges(state):
        if edge.target not in names:
            yield Problem(f"unknown target state {edge.target!r}", source, state.name, field)
        if edge.when is not None:
            try:
                compile_guard(edge.when)
            except jmespath.exceptions.JMESPathError as exc:
                yield Problem(
                    f"guard {edge.when!r} does not compile: {exc}", source, state.name, field
                )


def _labelled_edges(state: StateDefinition) -> Iterator[tuple[str, Edge]]:
    for i, edge in enumerate(state.on_success):
        yield f"on_success[{i}]", edge
    if state.on_failure is not None:
        yield "on_failure", state.on_failure


def _graph_problems(d: MachineDefinition, source: str) -> Iterator[Problem]:
    graph = {s.name: {e.target for e in s.edges} for s in d.states}
    for s in d.states:
        if any(e.loop for e in s.edges):  # taking a loop edge past the bound exits here
            graph[s.name].add(d.on_loop_exhausted)
    reachable = _reach(graph, [d.initial_state])
    for state in d.states:
        if state.name not in reachable:
            yield Problem("unreachable from the initial state", source, state.name, None)
    terminals = [s.name for s in d.states if s.terminal is not None]
    if not terminals:
        yield Problem("no terminal state (terminal: completed|failed)", source, None, "states")
        return
    reverse: dict[str, set[str]] = {name: set() for name in graph}
    for origin, targets in graph.items():
        for target in targets:
            reverse[target].add(origin)
    finishing = _reach(reverse, terminals)
    for state in d.states:
        if state.name not in finishing:
            yield Problem("cannot reach a terminal state", source, state.name, None)
    yield from _unbounded_cycles(d, source)


def _reach(graph: dict[str, set[str]], starts: list[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(graph.get(node, ()))
    return seen


def _unbounded_cycles(d: MachineDefinition, source: str) -> Iterator[Problem]:
    """Every cycle must pass through an edge marked loop: true, which the machine bound counts."""
    graph = {s.name: [e.target for e in s.edges if not e.loop] for s in d.states}
    state: dict[str, Literal[1, 2]] = {}  # 1 = on the current path, 2 = done
    for root in graph:
        if root in state:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(graph[root]))]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                yield Problem(
                    f"cycle through {child!r} has no edge marked loop: true, so nothing bounds it",
                    source,
                    node,
                    None,
                )
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(graph[child])))


def _context_problems(d: MachineDefinition, source: str, targets_known: bool) -> Iterator[Problem]:
    if d.context_schema is None:
        return
    problem = schema_problem(d.context_schema)
    if problem is not None:
        yield Problem(problem, source, None, "context_schema")
        return
    for i, schedule in enumerate(d.schedules):  # checked again at each tick, by the start
        mismatch = context_problem(d.context_schema, schedule.context)
        if mismatch is not None:
            field = f"schedules[{i}].context"
            yield Problem(f"does not match the context_schema: {mismatch}", source, None, field)
    if targets_known and not any(_prompt_errors(d)):
        yield from _unprovided_variables(d, source)


def _prompt_errors(d: MachineDefinition) -> Iterator[str]:
    for state in d.states:
        try:
            TEMPLATES.parse(state.prompt)
        except jinja2.TemplateSyntaxError as exc:
            yield str(exc)


def _unprovided_variables(d: MachineDefinition, source: str) -> Iterator[Problem]:
    """A prompt that uses a key neither the context_schema requires nor every way into its
    state provides (a required output of a state whose success leads there) cannot render
    on that way. Only checked with a schema: without one, what a context holds is unknown."""
    required = (d.context_schema or {}).get("required", [])
    # with the loop counters every context holds (core.transition: LOOP_COUNT, LOOP_LIMIT)
    given = _provided_on_entry(d, frozenset(required) | {"retryCount", "maxRetries"})
    for state in d.states:
        missing = sorted(variables(state.prompt)[0] - given.get(state.name, frozenset()))
        if missing and state.terminal is None and state.name in given:
            yield Problem(
                f"the prompt uses {', '.join(missing)}, which the context_schema does not "
                "require and not every way into this state provides (require it, or test it: "
                "{% if x %}, x | default(...))",
                source,
                state.name,
                "prompt",
            )


def _provided_on_entry(d: MachineDefinition, start: frozenset[str]) -> dict[str, frozenset[str]]:
    """The keys a context surely holds on entering each reachable state: what holds on every
    edge into it (a success edge adds its state's required output), to a fixed point."""
    given: dict[str, frozenset[str]] = {d.initial_state: start}
    changed = True
    while changed:
        changed = False
        for state in d.states:
            if state.name not in given or state.terminal is not None:
                continue
            after = given[state.name] | set(state.required_output)
            for edge, keys in _ways_out(d, state, after, given[state.name]):
                merged = keys if edge not in given else given[edge] & keys
                if given.get(edge) != merged:
                    given[edge] = merged
                    changed = True
    return given


def _ways_out(
    d: MachineDefinition, state: StateDefinition, succeeded: frozenset[str], failed: frozenset[str]
) -> Iterator[tuple[str, frozenset[str]]]:
    for edge in state.on_success:
        yield edge.target, succeeded
        if edge.loop:
            yield d.on_loop_exhausted, succeeded
    if state.on_failure is not None:
        yield state.on_failure.target, failed
        if state.on_failure.loop:
            yield d.on_loop_exhausted, failed
