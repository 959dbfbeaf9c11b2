"""Machine definitions: the models of machines, states, edges and their children."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterator
from datetime import datetime, timedelta
from enum import StrEnum
from functools import cached_property, lru_cache
from typing import Any, Literal

import jmespath
import jmespath.exceptions
from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, field_validator, model_validator

from fsm_celery.core import gate
from fsm_celery.core.duration import Duration
from fsm_celery.core.gate import Approval
from fsm_celery.core.schedule import Schedule
from fsm_celery.core.signal import Wait
from fsm_celery.core.tool import ToolCall
from fsm_celery.core.usage import Budget

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
    required_output: tuple[str, ...] = ()  # the contract's short form (fsm_celery.core.contract)
    output_schema: dict[str, Any] | None = None  # a JSON Schema 2020-12 the output must match
    max_corrections: int | None = Field(default=None, ge=0, le=100)  # None: FSM_MAX_CORRECTIONS
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
    # a worker calls one tool of an MCP server, not an agent (fsm_celery.core.tool)
    tool: ToolCall | None = None

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
            if not state.fans_out and state.tool is None:  # a tool state: no agent
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


def compile_problem(expression: str) -> str | None:
    """Why a JMESPath expression (a guard, a map's items, a body's input) does not compile, in
    one line, or None."""
    try:
        compile_guard(expression)
    except jmespath.exceptions.JMESPathError as exc:
        return f"does not compile: {_one_line(exc)}"
    return None
