"""Replay: a machine's recorded history run again through the core against a definition (its
own, a newer version, a file not loaded yet), calling no agent. Each history row gives back the
event the core decided (an agent's answer, a deadline, a join, people's verdict, an outside
event, an operator's command, a rewind); the core decides it again on the machine as the replay
has left it, and the replay reports, step by step, whether the definition takes the path the run
took, and where and why it does not: a guard now false, a required key now missing, a state
renamed or removed, a retry more or less, a loop counted differently.

It stops at the first divergence: past it, the recorded answers were to states the definition
would not have visited. What is compared at each step: the state moved to, whether the step
succeeded and how it failed, and the context after it (where the history kept its changes:
fsm_celery.core.timeline); at the end, the status the machine ended in.

What the core was given comes from the row: an `ack`'s output, its agent's success told from an
answer the definition refused by the row's failure kind (recorded since migration 0016; read
from the error the core wrote before), a `join`'s merged output (its children are machines of
their own, replayed alone), a `signal`'s name and payload, an `approval`'s verdict and fields.
A budget is the operator's, not the definition's: a step its budget paused stays paused. Pure.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any
from uuid import UUID

from fsm_celery.core import attempt_events as events
from fsm_celery.core import timeline
from fsm_celery.core.admin import Action, Command, decide_command, decide_rewind
from fsm_celery.core.correction import REFUSED
from fsm_celery.core.definition import Edge, FailureKind, MachineDefinition, StateDefinition
from fsm_celery.core.guard import GuardFailed, chosen_edge, guard_holds
from fsm_celery.core.transition import (
    NO_LIMITS,
    Limits,
    Machine,
    MachineStatus,
    Rejected,
    RejectReason,
    Transition,
    decide,
    status_in,
)
from fsm_celery.core.usage import BUDGET_EXCEEDED

BEGINNINGS = ("start", "fork")
COMMANDS = frozenset(action.value for action in Action)
MOVED_BY_PEOPLE = COMMANDS | {"rewind"}  # what can follow a step its budget paused
NO_ID = UUID(int=0)
# what the core writes for an answer given as a success that the definition refused, by the
# rows recorded before their failure kind was (an agent's own error is anything else)
_REFUSED_OUTPUT = re.compile(
    r"missing required output: |guard .* failed on the output: |the output would grow the context"
)
_FAILED_AS = {  # a failed step of these events failed one way
    "timeout": FailureKind.TIMEOUT,
    "dispatch_error": FailureKind.DISPATCH,
    "approval": FailureKind.FAILURE,  # rejected
}
_RETRY = re.compile(r" \(retry \d+ of \d+\)$")
_SHOWN = 60  # characters of a value quoted in a context difference


class Outcome(StrEnum):
    SAME = "same"  # the definition takes the recorded path, step by step
    DIVERGED = "diverged"
    UNREPLAYABLE = "unreplayable"  # the history cannot give back what the core was given


@dataclass(frozen=True)
class Row:
    """What replay reads of one history row (state_transitions)."""

    attempt: int
    event: str
    from_state: str | None
    to_state: str
    success: bool
    output: Mapping[str, Any] | None = None
    error: str | None = None
    actor: str | None = None
    reason: str | None = None
    failure: str | None = None
    context_delta: Mapping[str, Any] | None = None


@dataclass(frozen=True)
class Step:
    """One replayed step: where the run went and where the definition goes now."""

    attempt: int
    event: str
    state: str | None  # where the machine was (None: its start)
    recorded: str
    replayed: str | None  # None: the definition refuses the step now
    why: str | None = None  # the difference, at the step that diverges

    @property
    def same(self) -> bool:
        return self.why is None


@dataclass(frozen=True)
class Replay:
    """The verdict: the same path, where it diverges and why, or why it cannot be replayed."""

    outcome: Outcome
    steps: tuple[Step, ...]
    why: str | None = None
    at: int | None = None  # the step that diverges, or that cannot be replayed
    status: str | None = None  # the status the replay ends in

    @property
    def diverged(self) -> Step | None:
        return self.steps[-1] if self.outcome is Outcome.DIVERGED else None


def replay(
    definition: MachineDefinition,
    rows: Sequence[Row],
    *,
    status: str | None = None,
    limits: Limits = NO_LIMITS,
    machine_id: UUID = NO_ID,
) -> Replay:
    """Replay the history (rows in attempt order) against the definition; `status` is the
    machine's now, compared with the one the replay ends in. An answer refused is no step: the
    attempt's own row follows it."""
    rows = [row for row in rows if row.event != REFUSED]
    if not rows:
        return Replay(Outcome.UNREPLAYABLE, (), "no history is recorded", None)
    first = rows[0]
    why: str | None
    if first.event not in BEGINNINGS:
        why = f"its history begins with a {first.event!r} step, not its start"
        return Replay(Outcome.UNREPLAYABLE, (), why, first.attempt)
    if first.context_delta is None:
        why = "its history was recorded before steps kept their context (migration 0014)"
        return Replay(Outcome.UNREPLAYABLE, (), why, first.attempt)
    begun = Step(first.attempt, first.event, None, first.to_state, first.to_state)
    why = _beginning_differs(definition, first)
    if why is not None:
        return _diverged([replace(begun, replayed=definition.initial_state, why=why)])
    context = timeline.apply({}, first.context_delta)
    machine = Machine(
        id=machine_id,
        current_state=first.to_state,
        status=status_in(definition, first.to_state),
        attempt=first.attempt + 1,
        state_retries=0,
        context=context,
    )
    return _run(definition, rows, machine, limits, status, begun)


def _run(
    definition: MachineDefinition,
    rows: Sequence[Row],
    machine: Machine,
    limits: Limits,
    status: str | None,
    begun: Step,
) -> Replay:
    steps = [begun]
    why: str | None
    recorded: dict[str, Any] | None = dict(machine.context)  # None once a change is missing
    for i, row in enumerate(rows[1:], start=1):
        if row.attempt != machine.attempt:
            gap = f"step {machine.attempt} is missing from its history (the next is {row.attempt})"
            return Replay(Outcome.UNREPLAYABLE, tuple(steps), gap, machine.attempt)
        decided = _decided(definition, machine, row, rows[i - 1].from_state, limits)
        if isinstance(decided, str):
            return Replay(Outcome.UNREPLAYABLE, tuple(steps), decided, row.attempt)
        if isinstance(decided, Transition) and _paused_for_budget(row, rows[i + 1 :], status):
            decided = replace(decided, status=MachineStatus.PAUSED, error=row.error)
        step = Step(row.attempt, row.event, row.from_state, row.to_state, _to(decided))
        why = _difference(definition, machine, row, decided)
        if why is None and isinstance(decided, Transition):
            recorded = _recorded_after(recorded, row)
            why = _context_differs(recorded, decided.context)
        if why is not None:
            steps.append(replace(step, why=why))
            return _diverged(steps)
        assert isinstance(decided, Transition)
        steps.append(step)
        machine = Machine(
            id=machine.id,
            current_state=decided.to_state,
            status=decided.status,
            attempt=decided.attempt,
            state_retries=decided.state_retries,
            context=decided.context,
            usage=machine.usage + decided.usage,
            handbacks=decided.handbacks,
        )
    if status is not None and status != machine.status.value:
        last = steps[-1]
        now = f"{machine.status.value} in {machine.current_state}"
        why = f"the machine ends {now} now; the run is {status}"
        steps[-1] = replace(last, why=why)
        return _diverged(steps)
    return Replay(Outcome.SAME, tuple(steps), None, None, machine.status.value)


def _diverged(steps: list[Step]) -> Replay:
    last = steps[-1]
    return Replay(Outcome.DIVERGED, tuple(steps), last.why, last.attempt)


def _beginning_differs(definition: MachineDefinition, first: Row) -> str | None:
    if first.to_state not in definition.states_by_name:
        return _not_a_state(first.to_state)
    if first.event == "start" and definition.initial_state != first.to_state:
        return (
            f"the definition starts in {definition.initial_state} now; "
            f"the run started in {first.to_state}"
        )
    return None


def _not_a_state(name: str) -> str:
    return f"{name} is not a state of the definition now (renamed or removed)"


def _to(decided: Transition | Rejected) -> str | None:
    return decided.to_state if isinstance(decided, Transition) else None


def _decided(
    definition: MachineDefinition, machine: Machine, row: Row, before: str | None, limits: Limits
) -> Transition | Rejected | str:
    """What the definition decides now of the step the row records (a string: why the row
    cannot say what the core was given)."""
    if machine.current_state not in definition.states_by_name:
        return Rejected(RejectReason.WRONG_STATE, _not_a_state(machine.current_state))
    if row.event in COMMANDS:
        target = row.to_state if row.event == Action.FORCE.value else None
        command = Command(Action(row.event), row.actor or "", row.reason or "", target)
        return decide_command(definition, machine, command, before)
    if row.event == "rewind":
        if row.context_delta is None:
            return "the rewind kept no context"
        if row.to_state not in definition.states_by_name:
            return Rejected(RejectReason.WRONG_STATE, _not_a_state(row.to_state))
        context = timeline.apply(machine.context, row.context_delta)
        return decide_rewind(definition, machine, row.to_state, context)
    event = _event(row)
    if event is None:
        return f"a {row.event!r} step is not one replay knows"
    return decide(definition, machine, event, limits)


def _event(row: Row) -> events.Event | None:
    """The event the core was given, from the row that records what it decided."""
    state, attempt = row.from_state or "", row.attempt
    output = dict(row.output or {})
    if row.event == "ack":
        return events.Ack(state, attempt, _answered_success(row), output, _agents_error(row))
    if row.event == "join":
        return events.Joined(state, attempt, _answered_success(row), output, _agents_error(row))
    if row.event == "timeout":
        return events.Timeout(state, attempt)
    if row.event == "handback":
        return events.HandBack(state, attempt, row.reason)
    if row.event == "dispatch_error":
        error = (row.error or "").removeprefix("not dispatched: ")
        return events.DispatchFailed(state, attempt, error)
    if row.event == "approval":
        return events.GateDecided(state, attempt, row.success, output)
    if row.event == "signal":
        return events.EventArrived(state, attempt, row.reason or "", output)
    return None


def failure_of(row: Row) -> FailureKind | None:
    """How the recorded step failed: its failure kind, or for a row recorded before it was
    kept, what the event and the error the core wrote say (an answer given as a success and
    refused, else the agent's failure; a hand-back past its limit)."""
    if row.success:
        return None
    if row.failure is not None:
        return FailureKind(row.failure)
    error = row.error or ""
    if row.event in ("ack", "join"):
        refused = _REFUSED_OUTPUT.match(error)
        return FailureKind.INVALID_OUTPUT if refused else FailureKind.FAILURE
    if row.event == "handback":
        return FailureKind.FAILURE if "counted as a failure" in error else None
    return _FAILED_AS.get(row.event)


def _answered_success(row: Row) -> bool:
    """Whether the agent (or the join) answered with a success: a step that succeeded, or one
    whose answer the definition refused."""
    return row.success or failure_of(row) is FailureKind.INVALID_OUTPUT


def _agents_error(row: Row) -> str | None:
    if row.success or row.error is None:
        return None
    return _RETRY.sub("", row.error)


def _paused_for_budget(row: Row, later: Sequence[Row], status: str | None) -> bool:
    """Whether the step was paused by the machine's budget (an operator's bound, not the
    definition's: kept as recorded): its error says so, and what follows it is an operator's
    (or nothing, the machine paused now)."""
    if row.event not in ("ack", "join") or not (row.error or "").startswith(BUDGET_EXCEEDED):
        return False
    if later:
        return later[0].event in MOVED_BY_PEOPLE
    return status == MachineStatus.PAUSED.value


def _difference(
    definition: MachineDefinition, machine: Machine, row: Row, decided: Transition | Rejected
) -> str | None:
    """Why the step the definition takes now is not the recorded one, or None."""
    if isinstance(decided, Rejected):
        return f"the definition refuses this step now: {decided.detail}"
    then = failure_of(row)
    if decided.to_state != row.to_state:
        return _explained(definition, machine, row, decided)
    if decided.failure is not then:
        was = then.value if then is not None else "succeeded"
        now = decided.failure.value if decided.failure is not None else "succeeds"
        return f"{row.from_state}: {_with_error(now, decided)}; the run's {was}"
    return None


def _with_error(what: str, decided: Transition) -> str:
    return f"{what} now ({decided.error})" if decided.error else f"{what} now"


def _explained(
    definition: MachineDefinition, machine: Machine, row: Row, decided: Transition
) -> str:
    """Why the definition goes elsewhere now: the answer refused or failed otherwise, a retry,
    the guards of the edges it chooses between, a loop's limit."""
    head = f"{row.from_state}: → {decided.to_state} now, the run went → {row.to_state}"
    if decided.failure is not None and decided.failure is not failure_of(row):
        return f"{head} ({decided.error})"
    limit = decided.error if decided.error and "loop limit reached" in decided.error else None
    edges = _edges(definition.state(machine.current_state), row)
    said = _guards(edges, row, machine) if edges else ""
    if said:
        return f"{head}: {said}" + (f" ({limit})" if limit else "")
    return f"{head} ({decided.error})" if decided.error else head


def _edges(state: StateDefinition, row: Row) -> tuple[Edge, ...]:
    """The edges the step chose between (those with guards on its output)."""
    if row.event in ("ack", "join"):
        return state.on_success
    if row.event == "approval":
        return state.on_approve if row.success else state.on_reject
    if row.event == "signal":
        return state.on_event
    return ()


def _guards(edges: tuple[Edge, ...], row: Row, machine: Machine) -> str:
    """What the guards say now, where they choose another edge than the run's: the edge to
    where the run went, and the edge taken instead ("" when they choose the same edge)."""
    output = dict(row.output or {})
    context = {**machine.context, **output}
    try:
        taken = chosen_edge(edges, output, context)
    except GuardFailed:
        return ""
    theirs = next((e for e in edges if e.target == row.to_state), None)
    if taken is theirs:
        return ""
    said = []
    if theirs is None:
        said.append(f"no edge of {row.from_state} leads to {row.to_state} now")
    elif theirs.when is not None:
        said.append(f"guard {theirs.when!r} → {row.to_state} is {_holds(theirs, output, context)}")
    if taken.when is None:
        said.append(f"the default edge → {taken.target} is taken")
    else:
        said.append(f"guard {taken.when!r} → {taken.target} is {_holds(taken, output, context)}")
    return "; ".join(said)


def _holds(edge: Edge, output: Mapping[str, Any], context: Mapping[str, Any]) -> str:
    assert edge.when is not None
    try:
        return "true" if guard_holds(edge.when, output, context) else "false"
    except GuardFailed as exc:
        return f"an error ({exc.error})"


def _recorded_after(recorded: dict[str, Any] | None, row: Row) -> dict[str, Any] | None:
    """The run's context after the row (None once a step kept no change)."""
    if recorded is None or row.context_delta is None:
        return None
    return timeline.apply(recorded, row.context_delta)


def _context_differs(recorded: Mapping[str, Any] | None, now: Mapping[str, Any]) -> str | None:
    if recorded is None:
        return None
    change = timeline.change(recorded, now)
    if change is None:
        return None
    said = [
        f"{k}: {_shown(recorded.get(k))} in the run, {_shown(v)} now"
        for k, v in change.get("set", {}).items()
    ]
    said += [f"{k}: {_shown(recorded[k])} in the run, unset now" for k in change.get("unset", ())]
    return "the context after it differs: " + "; ".join(said)


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= _SHOWN else text[: _SHOWN - 1] + "…"
