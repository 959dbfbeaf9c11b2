"""Machine definitions: states, edges, and the static validator."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator, Mapping
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property, lru_cache
from typing import Any, Literal

import jinja2
import jmespath
import jmespath.exceptions
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from fsm_celery.core import gate
from fsm_celery.core.context import context_problem, schema_problem
from fsm_celery.core.duration import Duration
from fsm_celery.core.gate import Approval
from fsm_celery.core.prompt import TEMPLATES, variables
from fsm_celery.core.schedule import Schedule
from fsm_celery.core.signal import Wait
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

    delay: Duration = timedelta(seconds=1)
    rate: float = Field(default=2.0, ge=1.0)
    max_delay: Duration = timedelta(minutes=5)
    jitter: Jitter = Jitter.FULL


class Edge(BaseModel):
    """A way out of a state: a target, an optional guard, and whether it counts as a loop."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    target: str
    when: str | None = None
    loop: bool = False


def _edge(value: Any) -> Any:
    return {"target": value} if isinstance(value, str) else value


class ParentCancel(StrEnum):
    """What a fan-out's children do when their parent is paused, resumed or cancelled."""

    CANCEL = "cancel"  # they follow it, all the way down the tree
    ABANDON = "abandon"  # they run on alone; their ends no longer count for the parent


# A child's input: a JMESPath expression that yields an object, or one expression per key. Both
# see {"context": the parent's context, "item": a map's element, "index": its position}.
Input = str | dict[str, str]


class Body(BaseModel):
    """What one child of a fan-out runs: states of its own (a small machine, written inline as
    the top-level states are), or a machine of another definition (`machine:`)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    machine: str | None = Field(default=None, max_length=50, pattern=NAME_PATTERN)
    initial_state: str | None = None
    states: tuple[StateDefinition, ...] = ()
    agent_type: str | None = Field(default=None, max_length=10, min_length=1)
    max_loops: int = Field(default=3, ge=0)
    on_loop_exhausted: str = "FAILED"
    input: Input | None = None
    output: tuple[str, ...] | None = None  # the fields of the child's final context it returns


class Branch(Body):
    """One branch of a parallel state."""

    name: str = Field(max_length=50, pattern=NAME_PATTERN)


class AtLeast(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    at_least: int = Field(ge=1)


class Parallel(BaseModel):
    """Named branches, all started at once, joined by a policy."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    branches: tuple[Branch, ...] = Field(min_length=1, max_length=100)
    join: Literal["all", "any"] | AtLeast = "all"
    tolerated_failures: int = Field(default=0, ge=0)


class MapSpec(Body):
    """One child per element of a list in the context."""

    items: str  # JMESPath over {"context": ...}: the list
    item_key: str = Field(default="item", max_length=50, pattern=NAME_PATTERN)
    max_concurrency: int | None = Field(default=None, ge=1, le=100_000)
    tolerated_failures: int | str = 0  # a count, or a percentage of the items ("10%")
    result_key: str | None = Field(default=None, max_length=50, pattern=NAME_PATTERN)

    @field_validator("tolerated_failures")
    @classmethod
    def _tolerated(cls, value: int | str) -> int | str:
        if isinstance(value, int):
            if value < 0:
                raise ValueError("tolerated_failures must be >= 0")
            return value
        if not re.fullmatch(r"(100|[0-9]{1,2})(\.[0-9]+)?%", value.strip()):
            raise ValueError(f"tolerated_failures must be a count or a percentage, got {value!r}")
        return value.strip()


class StateDefinition(BaseModel):
    """One state: what the agent is told, what it must return, and where to go next."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(max_length=50, pattern=NAME_PATTERN)
    description: str = ""
    prompt: str = ""
    required_output: tuple[str, ...] = ()
    on_success: tuple[Edge, ...] = ()
    on_failure: Edge | None = None
    timeout: Duration = timedelta(minutes=5)
    heartbeat_timeout: Duration | None = None
    max_duration: Duration | None = None  # an attempt's limit however many heartbeats arrive
    max_retries: int = Field(default=0, ge=0)
    retry_on: tuple[FailureKind, ...] = RETRYABLE
    backoff: Backoff = Backoff()
    terminal: Terminal | None = None
    # who does the work: an agent of this type (default: the machine's), or children
    agent_type: str | None = Field(default=None, max_length=10, min_length=1)
    parallel: Parallel | None = None
    map: MapSpec | None = None
    machine: str | None = Field(default=None, max_length=50, pattern=NAME_PATTERN)
    input: Input | None = None  # a `machine:` state's child input
    output: tuple[str, ...] | None = None  # what of a `machine:` state's child it returns
    on_parent_cancel: ParentCancel = ParentCancel.CANCEL  # what the state's children do
    # people decide it, not an agent (fsm_celery.core.gate): where each verdict leads, and
    # what its deadline decides (approve, reject, or a state to escalate to; default reject)
    approval: Approval | None = None
    on_approve: tuple[Edge, ...] = ()
    on_reject: tuple[Edge, ...] = ()
    on_timeout: str | None = None
    # an outside event decides it (fsm_celery.core.signal): where its payload leads
    wait: Wait | None = None
    on_event: tuple[Edge, ...] = ()

    @model_validator(mode="before")
    @classmethod
    def _gate_timeout(cls, data: Any) -> Any:
        """An approval or a wait lasts a day unless its definition says how long: people and
        outside systems take hours."""
        if not isinstance(data, dict) or "timeout" in data:
            return data
        if data.get("approval") is not None or data.get("wait") is not None:
            return {**data, "timeout": gate.DEFAULT_TIMEOUT}
        return data

    @field_validator("on_success", "on_approve", "on_reject", "on_event", mode="before")
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
        failure = (self.on_failure,) if self.on_failure else ()
        people = self.on_approve + self.on_reject + self.on_event
        return self.on_success + failure + people + self.escalation

    @property
    def escalation(self) -> tuple[Edge, ...]:
        """An approval's or a wait's edge to the state its deadline leads to, if it names one."""
        if self.on_timeout is None or self.on_timeout in (gate.APPROVE, gate.REJECT):
            return ()
        return (Edge(target=self.on_timeout),)

    @property
    def awaits(self) -> bool:
        """Whether people or an outside event decide the state, not an agent or children."""
        return self.approval is not None or self.wait is not None

    @property
    def fans_out(self) -> bool:
        """Whether children do the state's work (parallel, map or machine), not an agent."""
        return self.parallel is not None or self.map is not None or self.machine is not None

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
    """Where to POST when a machine of the type ends, or waits for people, and for which."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    url: str = Field(max_length=2000, pattern=r"^https?://[^\s]+$")
    on: tuple[Literal["completed", "failed", "cancelled", "approval"], ...] = (
        "completed",
        "failed",
        "cancelled",
        "approval",  # people waited for at an approval gate
    )


class AgentTypeLimit(BaseModel):
    """A bound on one agent type's work in flight, across all machines (a provider's rate limit
    is per account, not per machine)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    max_in_flight: int = Field(ge=1, le=1_000_000)


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
    # per agent type: how much of its work may be in flight at once, across all machines
    agent_types: dict[str, AgentTypeLimit] = Field(default_factory=dict, max_length=50)

    _inline: dict[tuple[str, str | None], MachineDefinition] = PrivateAttr(default_factory=dict)

    @cached_property
    def states_by_name(self) -> dict[str, StateDefinition]:
        """Its states by name: kept in the instance's own attributes, where a private
        attribute's every read goes through pydantic's __getattr__ (a few lookups a decision)."""
        return {s.name: s for s in self.states}

    def state(self, name: str) -> StateDefinition:
        """The state called name (KeyError if there is none)."""
        return self.states_by_name[name]

    def agent_type_of(self, state: StateDefinition) -> str:
        """The agent type that works the state."""
        return state.agent_type or self.agent_type

    def agent_types_named(self) -> frozenset[str]:
        """Every agent type that works a state of the machine or of its inline children: each
        needs an agent serving it (another definition's children name their own)."""
        named = {self.agent_type}
        for state in self.states:
            if not state.fans_out:
                named.add(self.agent_type_of(state))
            for branch, body in self.children(state):
                if body.machine is None:
                    named |= self.inline(state.name, branch).agent_types_named()
        return frozenset(named)

    def children(self, state: StateDefinition) -> tuple[tuple[str | None, Body], ...]:
        """What a fan-out state starts: (branch name, body) for each branch of a parallel
        state, or one body for a map (per item) and for a `machine:` state."""
        if state.parallel is not None:
            return tuple((branch.name, branch) for branch in state.parallel.branches)
        if state.map is not None:
            return ((None, state.map),)
        if state.machine is not None:
            return ((None, Body(machine=state.machine, input=state.input, output=state.output)),)
        return ()

    def child_type(self, state: StateDefinition, branch: str | None, body: Body) -> str:
        """The machine type of a child: the definition it names, or its inline states' own
        type, named by its place (`research_fanout.research`, `cto.build.tests`)."""
        if body.machine is not None:
            return body.machine
        return f"{self.type}.{state.name}" + (f".{branch}" if branch is not None else "")

    def inline(self, state_name: str, branch: str | None = None) -> MachineDefinition:
        """The machine an inline body makes: its states, typed by its place, in the same
        version as its parent (it is part of the parent's definition)."""
        key = (state_name, branch)
        found = self._inline.get(key)
        if found is None:
            state = self.state(state_name)
            body = dict(self.children(state))[branch]
            assert body.initial_state is not None  # the validator requires it of inline bodies
            found = self._inline[key] = MachineDefinition.model_construct(
                type=self.child_type(state, branch, body),
                agent_type=body.agent_type or state.agent_type or self.agent_type,
                description=f"{state_name}" + (f", branch {branch}" if branch else ""),
                initial_state=body.initial_state,
                max_loops=body.max_loops,
                on_loop_exhausted=body.on_loop_exhausted,
                states=body.states,
                agent_types=self.agent_types,
            )
        return found

    def at(self, machine_type: str) -> MachineDefinition:
        """The definition of a type inside this one (`type.state[.branch]...`), or itself."""
        parts = machine_type.split(".")
        found: MachineDefinition = self
        i = 1
        while i < len(parts):
            state = found.state(parts[i])
            branch = parts[i + 1] if state.parallel is not None else None
            i += 2 if branch is not None else 1
            found = found.inline(state.name, branch)
        return found

    def step_bound(self) -> int:
        """The most transitions a run can take: each loop pass visits each state, retries too."""
        visits = sum(s.max_retries + 1 for s in self.states if s.terminal is None)
        return (self.max_loops + 2) * visits

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready form that loads back to an equal definition."""
        body = self.model_dump(mode="json", exclude_defaults=True, by_alias=True)
        _keep_waiting_timeouts(self.states, body["states"])
        return body

    def digest(self) -> str:
        """A hash of the content, so a reload of an unchanged file makes no new version."""
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()


for _model in (Body, Branch, MapSpec):
    _model.model_rebuild()


def _keep_waiting_timeouts(states: tuple[StateDefinition, ...], dumped: list[Any]) -> None:
    """Write an approval's or a wait's timeout even where it equals the default of other
    states (5 minutes): left out, it would load back as the waiting states' default, a day."""
    for state, out in zip(states, dumped, strict=True):
        if state.awaits and "timeout" not in out:
            out["timeout"] = state.model_dump(mode="json", include={"timeout"})["timeout"]
        for dumped_body, body in _bodies(state, out):
            _keep_waiting_timeouts(body.states, dumped_body.get("states", []))


def _bodies(state: StateDefinition, out: dict[str, Any]) -> Iterator[tuple[dict[str, Any], Body]]:
    """Each inline body of a state with its dumped form."""
    if state.map is not None:
        yield out["map"], state.map
    if state.parallel is not None:
        yield from zip(out["parallel"]["branches"], state.parallel.branches, strict=True)


def _one_line(exc: jmespath.exceptions.JMESPathError) -> str:
    """jmespath's error without the two lines it adds (the expression again, and a caret under
    the column): a problem is one line, and it quotes the expression already."""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return first.removesuffix(", for expression:").removesuffix(":")


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
        yield from _fanout_problems(d, state, source)
    known = not any(p for p in _edge_targets_unknown(d, seen))
    if known:  # else graph checks would only repeat the unknown targets
        yield from _graph_problems(d, source)
    yield from _context_problems(d, source, known)


# The keys the engine keeps in every context: a fan-out may not write its results over them.
RESERVED_KEYS = ("retryCount", "maxRetries")


def _fanout_problems(
    d: MachineDefinition, state: StateDefinition, source: str
) -> Iterator[Problem]:
    """What is wrong with a state's children: its kind, its join, its bodies, its map."""
    kinds = [k for k in ("parallel", "map", "machine") if getattr(state, k) is not None]
    if not kinds:
        for field in ("input", "output", "on_parent_cancel"):
            if field in state.model_fields_set:
                yield Problem(
                    f"{field} applies to a state with children", source, state.name, field
                )
        return
    if len(kinds) > 1:
        kinds_text = " and ".join(kinds)
        yield Problem(f"a state has one kind of children, not {kinds_text}", source, state.name)
        return
    yield from _kind_problems(state, kinds[0], source)
    if state.parallel is not None:
        yield from _parallel_problems(d, state, state.parallel, source)
    if state.map is not None:
        yield from _map_problems(d, state, state.map, source)
    children = d.children(state)
    names = [branch for branch, _ in children]
    for branch, body in children:
        if names.count(branch) == 1:  # a duplicate branch, refused above, names no one body
            yield from _body_problems(d, state, branch, body, source)


def _kind_problems(state: StateDefinition, kind: str, source: str) -> Iterator[Problem]:
    name = state.name
    if state.terminal is not None:
        yield Problem(f"a terminal state starts no children ({kind})", source, name, kind)
    if state.prompt:
        yield Problem(
            f"a {kind} state has no prompt: its children do the work", source, name, "prompt"
        )
    if kind != "machine":
        for field in ("input", "output"):
            if field in state.model_fields_set:
                yield Problem(f"{field} goes on each of the {kind}'s bodies", source, name, field)


def _parallel_problems(
    d: MachineDefinition, state: StateDefinition, parallel: Parallel, source: str
) -> Iterator[Problem]:
    name = state.name
    names = [b.name for b in parallel.branches]
    for i, branch in enumerate(names):
        if branch in names[:i]:
            yield Problem(f"duplicate branch name {branch!r}", source, name, "parallel.branches")
        if branch in RESERVED_KEYS:
            yield Problem(
                f"branch {branch!r} would write its output over the engine's loop counter",
                source,
                name,
                "parallel.branches",
            )
    if isinstance(parallel.join, AtLeast) and parallel.join.at_least > len(names):
        yield Problem(
            f"join at_least: {parallel.join.at_least} is more than the {len(names)} branches",
            source,
            name,
            "parallel.join",
        )
    if parallel.tolerated_failures and parallel.join != "all":
        yield Problem(
            "tolerated_failures applies to join: all (any and at_least need fewer already)",
            source,
            name,
            "parallel.tolerated_failures",
        )
    if parallel.tolerated_failures >= len(names):
        yield Problem(
            f"tolerated_failures {parallel.tolerated_failures} tolerates every branch failing",
            source,
            name,
            "parallel.tolerated_failures",
        )


def _map_problems(
    d: MachineDefinition, state: StateDefinition, spec: MapSpec, source: str
) -> Iterator[Problem]:
    name = state.name
    try:
        compile_guard(spec.items)
    except jmespath.exceptions.JMESPathError as exc:
        yield Problem(
            f"items {spec.items!r} does not compile: {_one_line(exc)}", source, name, "map.items"
        )
        return
    items = " ".join(spec.items.split())  # as one line, in a message (YAML may fold it)
    result_key = spec.result_key or name
    clash = _clash(d, items, result_key)
    if clash is not None:
        yield Problem(f"result_key {result_key!r} {clash}", source, name, "map.result_key")
    if spec.max_concurrency is None and _bound(d, items) is None:
        yield Problem(
            f"map over {items} needs max_concurrency: nothing bounds the list (set "
            "max_concurrency, or give its context_schema property a maxItems)",
            source,
            name,
            "map.max_concurrency",
        )


def _clash(d: MachineDefinition, items: str, key: str) -> str | None:
    """How a map's result_key would clash with the context, or None."""
    if key in RESERVED_KEYS:
        return "would write over the engine's loop counter"
    if items.strip() == f"context.{key}":
        return f"would write the results over the list they come from ({items})"
    declared = (d.context_schema or {}).get("properties", {})
    if isinstance(declared, dict) and key in declared:
        return "is a property of the context_schema: the results would write over it"
    return None


def _bound(d: MachineDefinition, items: str) -> int | None:
    """The most items a map's list can hold, when its context_schema says (a simple
    `context.key` path to an array with maxItems), or None."""
    path = items.strip()
    if not re.fullmatch(r"context\.[A-Za-z_][A-Za-z0-9_]*", path):
        return None
    declared = (d.context_schema or {}).get("properties", {}).get(path.split(".", 1)[1])
    if isinstance(declared, dict) and isinstance(declared.get("maxItems"), int):
        return int(declared["maxItems"])
    return None


def _body_problems(
    d: MachineDefinition, state: StateDefinition, branch: str | None, body: Body, source: str
) -> Iterator[Problem]:
    name = state.name
    where = f"{name}.{branch}" if branch is not None else name
    field = "map" if state.map is not None else ("parallel.branches" if branch else None)
    if body.machine is not None:
        inline = [
            f for f in ("initial_state", "states", "agent_type") if f in body.model_fields_set
        ]
        if inline:
            yield Problem(
                f"a body runs a machine or states of its own, not both ({', '.join(inline)})",
                source,
                where,
                field,
            )
    elif not body.states or body.initial_state is None:
        yield Problem(
            "a body needs states and initial_state, or machine: another definition's type",
            source,
            where,
            field,
        )
    yield from _input_problems(body, source, where)
    if body.machine is None and body.states and body.initial_state is not None:
        inner = d.inline(name, branch)
        for problem in _problems(inner, source):
            inner_state = f"{where}.{problem.state}" if problem.state else where
            yield Problem(problem.message, source, inner_state, problem.field)


def _input_problems(body: Body, source: str, where: str) -> Iterator[Problem]:
    expressions = (
        {"input": body.input}
        if isinstance(body.input, str)
        else {f"input.{k}": v for k, v in (body.input or {}).items()}
    )
    for field, expression in expressions.items():
        try:
            compile_guard(expression)
        except jmespath.exceptions.JMESPathError as exc:
            yield Problem(
                f"{expression!r} does not compile: {_one_line(exc)}", source, where, field
            )


def tree_problems(
    definitions: Mapping[str, MachineDefinition], max_depth: int
) -> Iterator[Problem]:
    """What is wrong between definitions: a `machine:` naming no loaded type, definitions that
    start each other in a cycle, children nested deeper than max_depth."""
    starts: dict[str, set[str]] = {}
    for machine_type, d in definitions.items():
        starts[machine_type] = set()
        for state, branch, body, inner in _nested(d):
            if body.machine is None:
                continue
            starts[machine_type].add(body.machine)
            if body.machine not in definitions:
                where = f"{inner.type}.{state.name}".split(".", 1)[1]
                where += f".{branch}" if branch else ""
                yield Problem(
                    f"machine {body.machine!r} is not a loaded definition", machine_type, where
                )
    cycle = _cycle(starts)
    if cycle is not None:
        text = "definitions start each other in a cycle: " + " -> ".join(cycle)
        for machine_type in dict.fromkeys(cycle):  # under each, whichever of them is loaded
            yield Problem(text, machine_type, None)
        return
    depths: dict[str, int] = {}
    for machine_type in sorted(definitions):
        deepest = _depth(machine_type, definitions, depths)
        if deepest > max_depth:
            yield Problem(
                f"children nest {deepest} deep, past FSM_MAX_CHILD_DEPTH={max_depth}",
                machine_type,
            )


def _nested(
    d: MachineDefinition,
) -> Iterator[tuple[StateDefinition, str | None, Body, MachineDefinition]]:
    """Every (state, branch, body) inside d, its inline bodies' own included, with the
    definition each is in."""
    for state in d.states:
        for branch, body in d.children(state):
            yield state, branch, body, d
            if body.machine is None and body.initial_state is not None:
                yield from _nested(d.inline(state.name, branch))


def _cycle(starts: dict[str, set[str]]) -> list[str] | None:
    path: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done or node not in starts:
            return None
        path.append(node)
        for target in sorted(starts[node]):
            found = visit(target)
            if found is not None:
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(starts):
        found = visit(node)
        if found is not None:
            return found
    return None


def _depth(
    machine_type: str, definitions: Mapping[str, MachineDefinition], memo: dict[str, int]
) -> int:
    """How deep children nest under a machine of the type (0: it starts none)."""
    if machine_type not in memo:
        memo[machine_type] = 0  # no cycles here: _cycle refused them first
        memo[machine_type] = _inline_depth(definitions[machine_type], definitions, memo)
    return memo[machine_type]


def _inline_depth(
    d: MachineDefinition, definitions: Mapping[str, MachineDefinition], memo: dict[str, int]
) -> int:
    deepest = 0
    for state in d.states:
        for branch, body in d.children(state):
            if body.machine is not None:
                below = (
                    _depth(body.machine, definitions, memo) if body.machine in definitions else 0
                )
            else:
                below = _inline_depth(d.inline(state.name, branch), definitions, memo)
            deepest = max(deepest, 1 + below)
    return deepest


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
    if state.awaits:
        yield from _awaiting_problems(state, names, source)
        return
    yield from _gate_fields_elsewhere(state, source)
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


# What an approval state has none of: people decide it, from its form, at once or by its deadline.
NOT_AT_A_GATE = (
    "terminal",
    "prompt",
    "required_output",
    "on_success",
    "on_failure",
    "max_retries",
    "heartbeat_timeout",
    "max_duration",
    "agent_type",
    "parallel",
    "map",
    "machine",
)


def _awaiting_problems(state: StateDefinition, names: set[str], source: str) -> Iterator[Problem]:
    """What is wrong with a state people or an outside event decide."""
    if state.approval is not None and state.wait is not None:
        yield Problem(
            "a state waits for people or for an event, not both", source, state.name, "wait"
        )
    elif state.approval is not None:
        yield from _gate_problems(state, state.approval, names, source)
    elif state.wait is not None:
        yield from _wait_problems(state, state.wait, names, source)


def _gate_fields_elsewhere(state: StateDefinition, source: str) -> Iterator[Problem]:
    for field in ("on_approve", "on_reject", "on_timeout", "on_event"):
        if field in state.model_fields_set:
            kind = "a waiting" if field == "on_event" else "an approval or a waiting"
            yield Problem(f"{field} applies to {kind} state", source, state.name, field)


def _wait_problems(
    state: StateDefinition, wait: Wait, names: set[str], source: str
) -> Iterator[Problem]:
    name = state.name
    for field in (*NOT_AT_A_GATE, "on_approve", "on_reject"):
        if field in state.model_fields_set:
            yield Problem(
                f"a waiting state has no {field}: an event decides it", source, name, field
            )
    if not state.on_event:
        yield Problem("a waiting state needs on_event", source, name, "on_event")
    elif state.on_event[-1].when is not None:
        yield Problem(
            "the last on_event edge must have no guard (it is the default)",
            source,
            name,
            "on_event",
        )
    if state.on_timeout is None or state.on_timeout in (gate.APPROVE, gate.REJECT):
        yield Problem(
            "a waiting state needs on_timeout: the state it goes to when no event came",
            source,
            name,
            "on_timeout",
        )
    yield from _edge_problems(state, names, source)
    if wait.form is not None:
        problem = schema_problem(wait.form)
        if problem is not None:
            yield Problem(problem.replace("a context", "a payload"), source, name, "wait.schema")


def _gate_problems(
    state: StateDefinition, approval: Approval, names: set[str], source: str
) -> Iterator[Problem]:
    name = state.name
    for field in (*NOT_AT_A_GATE, "on_event"):
        if field in state.model_fields_set:
            yield Problem(
                f"an approval state has no {field}: people decide it", source, name, field
            )
    for field in ("on_approve", "on_reject"):
        edges: tuple[Edge, ...] = getattr(state, field)
        if not edges:
            yield Problem(f"an approval state needs {field}", source, name, field)
        elif edges[-1].when is not None:
            yield Problem(
                f"the last {field} edge must have no guard (it is the default)",
                source,
                name,
                field,
            )
    yield from _edge_problems(state, names, source)
    if isinstance(approval.quorum, int) and approval.quorum < 1:
        yield Problem(
            f"quorum must be at least 1, or all; got {approval.quorum}",
            source,
            name,
            "approval.quorum",
        )
    if approval.form is not None:
        problem = schema_problem(approval.form)
        if problem is not None:
            yield Problem(
                problem.replace("a context", "a decision"), source, name, "approval.schema"
            )


def _edge_problems(state: StateDefinition, names: set[str], source: str) -> Iterator[Problem]:
    for field, edge in _labelled_edges(state):
        if edge.target not in names:
            yield Problem(f"unknown target state {edge.target!r}", source, state.name, field)
        if edge.when is not None:
            try:
                compile_guard(edge.when)
            except jmespath.exceptions.JMESPathError as exc:
                yield Problem(
                    f"guard {edge.when!r} does not compile: {_one_line(exc)}",
                    source,
                    state.name,
                    field,
                )


def _labelled_edges(state: StateDefinition) -> Iterator[tuple[str, Edge]]:
    for i, edge in enumerate(state.on_success):
        yield f"on_success[{i}]", edge
    if state.on_failure is not None:
        yield "on_failure", state.on_failure
    for field in ("on_approve", "on_reject", "on_event"):
        for i, edge in enumerate(getattr(state, field)):
            yield f"{field}[{i}]", edge
    for edge in state.escalation:
        yield "on_timeout", edge


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
            after = given[state.name] | set(state.required_output) | _merged_keys(d, state)
            for edge, keys in _ways_out(d, state, after, given[state.name]):
                merged = keys if edge not in given else given[edge] & keys
                if given.get(edge) != merged:
                    given[edge] = merged
                    changed = True
    return given


def _merged_keys(d: MachineDefinition, state: StateDefinition) -> frozenset[str]:
    """The keys a fan-out state's join writes into the context."""
    if state.parallel is not None:
        return frozenset(b.name for b in state.parallel.branches)
    if state.map is not None:
        return frozenset({state.map.result_key or state.name})
    return frozenset(state.output or ())


def _ways_out(
    d: MachineDefinition, state: StateDefinition, succeeded: frozenset[str], failed: frozenset[str]
) -> Iterator[tuple[str, frozenset[str]]]:
    if state.approval is not None:
        yield from _ways_out_of_gate(d, state, state.approval, failed)
        return
    if state.wait is not None:  # the payload's required keys; nothing when it times out
        arrived = failed | set((state.wait.form or {}).get("required", ()))
        for edge in state.on_event:
            yield edge.target, arrived
            if edge.loop:
                yield d.on_loop_exhausted, arrived
        for edge in state.escalation:
            yield edge.target, failed
        return
    for edge in state.on_success:
        yield edge.target, succeeded
        if edge.loop:
            yield d.on_loop_exhausted, succeeded
    if state.on_failure is not None:
        yield state.on_failure.target, failed
        if state.on_failure.loop:
            yield d.on_loop_exhausted, failed


def _ways_out_of_gate(
    d: MachineDefinition, state: StateDefinition, approval: Approval, entered: frozenset[str]
) -> Iterator[tuple[str, frozenset[str]]]:
    """An approval's verdict adds its summary, and an approval its form's required fields
    (unless its deadline may approve, with none); an escalation adds nothing."""
    decided = entered | {gate.SUMMARY_KEY}
    approved = decided
    if state.on_timeout != gate.APPROVE:
        approved |= set((approval.form or {}).get("required", ()))
    for edges, keys in ((state.on_approve, approved), (state.on_reject, decided)):
        for edge in edges:
            yield edge.target, keys
            if edge.loop:
                yield d.on_loop_exhausted, keys
    for edge in state.escalation:
        yield edge.target, entered
