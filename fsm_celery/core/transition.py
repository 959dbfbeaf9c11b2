"""The transition decision: (definition, machine, event) → a Transition or a Rejected value."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any
from uuid import UUID

from pydantic_core import to_json

from fsm_celery.core import gate
from fsm_celery.core.attempt_events import (
    Ack,
    DispatchFailed,
    Event,
    EventArrived,
    GateDecided,
    HandBack,
    Joined,
    Timeout,
)
from fsm_celery.core.contract import contract_error
from fsm_celery.core.definition import (
    Edge,
    FailureKind,
    MachineDefinition,
    StateDefinition,
    Terminal,
)
from fsm_celery.core.guard import GuardFailed, chosen_edge
from fsm_celery.core.retry import jitter_unit, retry_delay
from fsm_celery.core.usage import NO_BUDGET, NOTHING, Budget, Usage, unbounded, usage_of

LOOP_COUNT = "retryCount"
LOOP_LIMIT = "maxRetries"


class MachineStatus(StrEnum):
    """Where a machine is in its life."""

    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"


class RejectReason(StrEnum):
    """Why an incoming message changed nothing."""

    MALFORMED_JSON = "malformed_json"
    SCHEMA_VIOLATION = "schema_violation"
    OVERSIZED = "oversized"
    UNKNOWN_MACHINE = "unknown_machine"
    BAD_TOKEN = "bad_token"
    NOT_RUNNING = "not_running"
    WRONG_STATE = "wrong_state"
    STALE_ATTEMPT = "stale_attempt"
    UNKNOWN_ATTEMPT = "unknown_attempt"
    INVALID_OUTPUT = "invalid_output"  # missing required keys, a guard that fails on it, too big
    INVALID_VALUE = "invalid_value"  # what cannot be stored (NUL, NaN, 2**64, a total past it)
    WRONG_AGENT = "wrong_agent"  # sent by an agent the machine is not assigned to
    REFUSED_COMMAND = "refused_command"
    UNPROCESSABLE = "unprocessable"


@dataclass(frozen=True)
class Machine:
    """What the core needs to know of a machine instance."""

    id: UUID
    current_state: str
    status: MachineStatus
    attempt: int
    state_retries: int
    context: Mapping[str, Any]
    usage: Usage = NOTHING
    budget: Budget = NO_BUDGET
    handbacks: int = 0  # attempts of this state visit handed back in a row
    corrections: int = 0  # answers of the current attempt refused (fsm_celery.core.correction)


@dataclass(frozen=True)
class Limits:
    """Bounds an operator sets on what agents can make a machine hold or do."""

    max_context_bytes: int | None = None  # the context as JSON, after an ack's output merged
    max_handbacks: int = 3  # hand-backs in a row re-dispatched free; the next counts as failure
    max_corrections: int = 2  # refused answers an attempt may correct, unless its state says


NO_LIMITS = Limits()


@dataclass(frozen=True)
class Rejected:
    """The event changes nothing; the reason says why."""

    reason: RejectReason
    detail: str


@dataclass(frozen=True)
class Transition:
    """What an event does to a machine: its next state and the history record of the attempt."""

    from_state: str
    to_state: str
    success: bool
    status: MachineStatus
    context: dict[str, Any]
    attempt: int
    state_retries: int
    output: dict[str, Any] | None
    error: str | None = None
    failure: FailureKind | None = None
    delay_seconds: float = 0.0  # wait before the next state is entered (retry backoff)
    usage: Usage = NOTHING  # what this attempt spent
    budget: Budget | None = None  # a new budget (set by an admin command)
    handbacks: int = 0  # the machine's hand-backs in a row after this transition
    agent_type: str | None = None  # who works the state it moves to (None: as before)

    @property
    def enters_state(self) -> bool:
        """Whether the next state must be entered (dispatched to an agent)."""
        return self.status is MachineStatus.RUNNING


Decision = Transition | Rejected


def status_in(definition: MachineDefinition, state: str) -> MachineStatus:
    """The status of a machine that is in the state: running, or how its terminal ends it."""
    terminal = definition.state(state).terminal
    if terminal is None:
        return MachineStatus.RUNNING
    return MachineStatus.COMPLETED if terminal is Terminal.COMPLETED else MachineStatus.FAILED


def initial_context(definition: MachineDefinition, context: Mapping[str, Any]) -> dict[str, Any]:
    """The context a new machine starts with: the caller's, plus the seed's loop counters."""
    merged = dict(context)
    merged.setdefault(LOOP_COUNT, 0)
    merged.setdefault(LOOP_LIMIT, definition.max_loops)
    return merged


def decide(
    definition: MachineDefinition, machine: Machine, event: Event, limits: Limits = NO_LIMITS
) -> Decision:
    """Decide what the event does to the machine. Pure: no I/O, no clock."""
    decision = _decide(definition, machine, event, limits)
    if isinstance(decision, Rejected):
        return decision
    agent_type = definition.agent_type_of(definition.state(decision.to_state))
    if not isinstance(event, Ack | Joined):
        return replace(decision, agent_type=agent_type)
    # a join's children's usage was counted as they spent it (rolled up to each ancestor)
    usage = usage_of(event.output) if isinstance(event, Ack) else NOTHING
    unfit = unbounded(machine.usage, usage)
    if unfit is not None:  # refused whole: a total the database cannot hold is no total
        return Rejected(RejectReason.INVALID_VALUE, unfit)
    over = machine.budget.exceeded_by(machine.usage + usage)
    if over is not None and decision.status is MachineStatus.RUNNING:
        # The work is recorded and the machine moves on, but spends nothing more until an
        # admin raises the budget.
        return replace(
            decision,
            agent_type=agent_type,
            usage=usage,
            status=MachineStatus.PAUSED,
            error=over,
            delay_seconds=0.0,
        )
    return replace(decision, agent_type=agent_type, usage=usage)


def typed(definition: MachineDefinition, transition: Transition) -> Transition:
    """The transition with the agent type of the state it moves to (a state may name its own)."""
    state = definition.state(transition.to_state)
    return replace(transition, agent_type=definition.agent_type_of(state))


def _decide(
    definition: MachineDefinition, machine: Machine, event: Event, limits: Limits
) -> Decision:
    rejected = check_event(machine, event.state, event.attempt)
    if rejected is not None:
        return rejected
    state = definition.state(machine.current_state)
    if state.approval is not None:
        return _decide_gate(definition, machine, state, event, limits)
    if state.wait is not None:
        return _decide_wait(definition, machine, state, event, limits)
    if isinstance(event, GateDecided | EventArrived):
        return Rejected(
            RejectReason.WRONG_STATE, f"{state.name} waits for neither people nor an event"
        )
    if isinstance(event, Timeout):
        return _fail(definition, machine, state, FailureKind.TIMEOUT, "timed out", None)
    if isinstance(event, HandBack):
        return _hand_back(definition, machine, state, event, limits)
    if isinstance(event, DispatchFailed):
        return _undispatchable(machine, state, event)
    if isinstance(event, Joined) and not event.success:
        error = event.error or "the join failed"
        return _fail(definition, machine, state, FailureKind.FAILURE, error, dict(event.output))
    return _decide_ack(definition, machine, state, event, limits)


def _undispatchable(machine: Machine, state: StateDefinition, event: DispatchFailed) -> Transition:
    """The machine fails at once, where it is: its definition and its context cannot make this
    state's instruction. A retry would render the same prompt from the same context, and the
    failure edge is the author's way out of failed *work*, which never started (it could send
    an agent to roll back what was never done). As Step Functions' States.Runtime: neither
    retried nor caught. An operator sees the state and the reason, and can force it on."""
    error = f"not dispatched: {event.error}"
    failed = MachineStatus.FAILED
    return _again(machine, state, 0, None, error, status=failed, failure=FailureKind.DISPATCH)


def _decide_ack(
    definition: MachineDefinition,
    machine: Machine,
    state: StateDefinition,
    event: Ack | Joined,
    limits: Limits,
) -> Transition:
    output = dict(event.output)
    if not event.success:
        error = event.error or "the agent reported failure"
        return _fail(definition, machine, state, FailureKind.FAILURE, error, output)
    missing = [key for key in state.required_output if key not in output]
    broken = f"missing required output: {', '.join(missing)}" if missing else None
    broken = broken or contract_error(state, output)
    if broken is not None:
        return _fail(definition, machine, state, FailureKind.INVALID_OUTPUT, broken, output)
    # an output that would overgrow the context or break a guard is the state's failure
    chosen = _edge_for(machine, state.on_success, output, limits, "the output")
    if isinstance(chosen, Rejected):
        kind = FailureKind.INVALID_OUTPUT
        return _fail(definition, machine, state, kind, chosen.detail, output)
    edge, context, output = chosen
    return _take(definition, machine, edge, context, output, None, None)


def _merged(machine: Machine, output: Mapping[str, Any]) -> dict[str, Any]:
    """The machine's context with the output merged in; the loop counters stay the engine's."""
    context = {**machine.context, **output}
    for counter in (LOOP_COUNT, LOOP_LIMIT):  # the loop bound is the engine's, not the agent's
        if counter in machine.context:
            context[counter] = machine.context[counter]
        else:
            context.pop(counter, None)
    return context


def _decide_gate(
    definition: MachineDefinition,
    machine: Machine,
    state: StateDefinition,
    event: Event,
    limits: Limits,
) -> Decision:
    """An approval state moves on its people's verdict or its deadline; nothing else (no agent
    was sent anything for it, so no ack can be for it). A rejection is the state's failure, as
    an agent's success: false is (FAILURE; TIMEOUT when its deadline rejected or escalated)."""
    if isinstance(event, Timeout):
        return _gate_timeout(definition, machine, state, limits)
    if not isinstance(event, GateDecided):
        return Rejected(
            RejectReason.WRONG_STATE, f"people decide {state.name}, an approval state, not agents"
        )
    edges = state.on_approve if event.approved else state.on_reject
    chosen = _edge_for(machine, edges, dict(event.output), limits, "the decision")
    if isinstance(chosen, Rejected):
        return chosen
    edge, context, output = chosen
    if event.approved:
        return _take(definition, machine, edge, context, output, None, None)
    error = f"rejected at {state.name}"
    return _take(definition, machine, edge, context, output, error, FailureKind.FAILURE)


def _edge_for(
    machine: Machine, edges: tuple[Edge, ...], output: dict[str, Any], limits: Limits, what: str
) -> tuple[Edge, dict[str, Any], dict[str, Any]] | Rejected:
    """The edge an ack's output, people's decision or an outside event takes (its fields, or its
    payload, merged into the context and read by the guards), with the context and the output;
    or why it cannot be taken: a context past its limit, a guard it breaks (for a decision or
    an event refused, not a failure: the machine stays where it is)."""
    context = _merged(machine, output)
    too_big = _context_too_big(context, limits)
    if too_big is not None:
        return Rejected(RejectReason.INVALID_OUTPUT, too_big)
    try:
        return chosen_edge(edges, output, context), context, output
    except GuardFailed as exc:
        detail = f"guard {exc.guard!r} failed on {what}: {exc.error}"
        return Rejected(RejectReason.INVALID_OUTPUT, detail)


def _decide_wait(
    definition: MachineDefinition,
    machine: Machine,
    state: StateDefinition,
    event: Event,
    limits: Limits,
) -> Decision:
    """A waiting state moves on the event it waits for, its payload read as the output, or on
    its deadline, to its on_timeout state (a timeout failure, not retried: the wait is one)."""
    assert state.wait is not None
    if isinstance(event, Timeout):
        assert state.on_timeout is not None  # the validator requires it of a waiting state
        error = f"no {state.wait.event} event before the deadline"
        context = dict(machine.context)
        edge = Edge(target=state.on_timeout)
        return _take(definition, machine, edge, context, None, error, FailureKind.TIMEOUT)
    if not isinstance(event, EventArrived):
        return Rejected(
            RejectReason.WRONG_STATE,
            f"{state.name} waits for a {state.wait.event} event, not for agents",
        )
    if event.name != state.wait.event:
        return Rejected(
            RejectReason.WRONG_STATE,
            f"{state.name} waits for a {state.wait.event} event, not {event.name}",
        )
    chosen = _edge_for(machine, state.on_event, dict(event.payload), limits, "the event")
    if isinstance(chosen, Rejected):
        return chosen
    edge, context, output = chosen
    return _take(definition, machine, edge, context, output, None, None)


def _gate_timeout(
    definition: MachineDefinition, machine: Machine, state: StateDefinition, limits: Limits
) -> Transition:
    """What an approval's deadline decides: its on_timeout (approve, reject, or a state to
    escalate to; reject by default)."""
    on_timeout = state.on_timeout or gate.REJECT
    if on_timeout not in (gate.APPROVE, gate.REJECT):
        edge = Edge(target=on_timeout)
        error = f"no decision before the deadline: escalated to {on_timeout}"
        context = dict(machine.context)
        return _take(definition, machine, edge, context, None, error, FailureKind.TIMEOUT)
    approved = on_timeout == gate.APPROVE
    verdict = gate.Verdict.APPROVED if approved else gate.Verdict.REJECTED
    output = gate.timed_out(verdict)
    context = _merged(machine, output)
    edges = state.on_approve if approved else state.on_reject
    try:
        edge = chosen_edge(edges, output, context)
    except GuardFailed:  # a guard the summary alone breaks: the default edge
        edge = edges[-1]
    why = f"no decision before the deadline: {verdict.value} (its on_timeout)"
    failure = None if approved else FailureKind.TIMEOUT
    return _take(definition, machine, edge, context, output, why, failure)


def _context_too_big(context: dict[str, Any], limits: Limits) -> str | None:
    if limits.max_context_bytes is None:
        return None
    size = len(to_json(context, inf_nan_mode="constants"))
    if size <= limits.max_context_bytes:
        return None
    return (
        f"the output would grow the context to {size} bytes, over the limit of "
        f"{limits.max_context_bytes}"
    )


def _hand_back(
    definition: MachineDefinition,
    machine: Machine,
    state: StateDefinition,
    event: HandBack,
    limits: Limits,
) -> Transition:
    """The same state again at once, as a new attempt, without counting a retry; past the
    limit of hand-backs in a row, a failure like any other (a flapping agent cannot loop)."""
    why = f"handed back: {event.reason}" if event.reason else "handed back"
    if machine.handbacks >= limits.max_handbacks:
        error = f"{why} ({machine.handbacks + 1} times in a row, counted as a failure)"
        return _fail(definition, machine, state, FailureKind.FAILURE, error, None)
    return _again(machine, state, machine.state_retries, None, why, handbacks=machine.handbacks + 1)


def _again(
    machine: Machine,
    state: StateDefinition,
    state_retries: int,
    output: dict[str, Any] | None,
    error: str,
    status: MachineStatus = MachineStatus.RUNNING,
    **more: Any,
) -> Transition:
    """The same state as a new attempt: entered again (a retry, a hand-back), or failed where
    it is."""
    return Transition(
        from_state=state.name,
        to_state=state.name,
        success=False,
        status=status,
        context=dict(machine.context),
        attempt=machine.attempt + 1,
        state_retries=state_retries,
        output=output,
        error=error,
        **more,
    )


def check_event(machine: Machine, state: str, attempt: int) -> Rejected | None:
    """Why a message for (state, attempt) cannot apply to the machine, or None if it can."""
    if attempt < machine.attempt:
        return Rejected(
            RejectReason.STALE_ATTEMPT,
            f"attempt {attempt} was already decided; the machine is at attempt {machine.attempt}",
        )
    if attempt > machine.attempt:
        return Rejected(
            RejectReason.UNKNOWN_ATTEMPT,
            f"attempt {attempt} is ahead of the machine, which is at attempt {machine.attempt}: "
            "its dispatch was rolled back (the transaction that sent it failed and was retried) "
            "or it was never sent",
        )
    if machine.status is not MachineStatus.RUNNING:
        return Rejected(RejectReason.NOT_RUNNING, f"the machine is {machine.status.value}")
    if state != machine.current_state:
        return Rejected(
            RejectReason.WRONG_STATE,
            f"the ack is for state {state!r} but the machine is in {machine.current_state!r}",
        )
    return None


def _count(value: Any, default: int) -> int:
    """A loop counter from the context; anything but a whole number >= 0 counts as the default."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    return default


def _fail(
    definition: MachineDefinition,
    machine: Machine,
    state: StateDefinition,
    kind: FailureKind,
    error: str,
    output: dict[str, Any] | None,
) -> Transition:
    if kind in state.retry_on and machine.state_retries < state.max_retries:
        retry = machine.state_retries + 1
        delay = retry_delay(state.backoff, retry, jitter_unit(machine.id, machine.attempt))
        error = f"{error} (retry {retry} of {state.max_retries})"
        return _again(machine, state, retry, output, error, failure=kind, delay_seconds=delay)
    assert state.on_failure is not None  # the validator requires it on non-terminal states
    return _take(definition, machine, state.on_failure, dict(machine.context), output, error, kind)


def _take(
    definition: MachineDefinition,
    machine: Machine,
    edge: Edge,
    context: dict[str, Any],
    output: dict[str, Any] | None,
    error: str | None,
    failure: FailureKind | None,
) -> Transition:
    target = edge.target
    if edge.loop:
        loops = _count(context.get(LOOP_COUNT), 0) + 1
        limit = _count(context.get(LOOP_LIMIT), definition.max_loops)
        context[LOOP_COUNT] = loops
        if loops > limit:
            target = definition.on_loop_exhausted
            reason = (
                f"loop limit reached: {loops} loops back to {edge.target}, {LOOP_LIMIT}={limit}"
            )
            error = f"{error}; {reason}" if error else reason
    status = status_in(definition, target)
    return Transition(
        from_state=machine.current_state,
        to_state=target,
        success=failure is None,
        status=status,
        context=context,
        attempt=machine.attempt + 1,
        state_retries=0,
        output=output,
        error=error,
        failure=failure,
    )
