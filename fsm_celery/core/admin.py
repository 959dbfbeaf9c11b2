"""Admin commands (pause, resume, cancel, retry, force) decided as values, like acks. Pure."""

from __future__ import annotations

from dataclasses import dataclass, replace
from enum import StrEnum

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.transition import (
    Machine,
    MachineStatus,
    Rejected,
    RejectReason,
    Transition,
    status_in,
    typed,
)


class Action(StrEnum):
    """What an operator can do to a machine."""

    PAUSE = "pause"
    RESUME = "resume"
    CANCEL = "cancel"
    RETRY = "retry"
    FORCE = "force"


@dataclass(frozen=True)
class Command:
    """An operator's command, with who gave it and why."""

    action: Action
    actor: str
    reason: str = ""
    target: str | None = None  # the state to force the machine into


ALLOWED: dict[Action, frozenset[MachineStatus]] = {
    Action.PAUSE: frozenset({MachineStatus.RUNNING}),
    Action.RESUME: frozenset({MachineStatus.PAUSED}),
    Action.CANCEL: frozenset({MachineStatus.RUNNING, MachineStatus.PAUSED}),
    Action.RETRY: frozenset(
        {MachineStatus.RUNNING, MachineStatus.PAUSED, MachineStatus.FAILED, MachineStatus.CANCELLED}
    ),
    Action.FORCE: frozenset(MachineStatus),
}
BUDGET = "budget"  # no Action (it decides no move) and taken in every status: a retried or
# forced machine runs again, so a finished one's budget can matter too


def commands(status: MachineStatus) -> list[str]:
    """The operator's commands a machine in that status accepts (what the dashboard offers)."""
    return [action.value for action in Action if status in ALLOWED[action]] + [BUDGET]


def decide_command(
    definition: MachineDefinition,
    machine: Machine,
    command: Command,
    last_working_state: str | None = None,
) -> Transition | Rejected:
    """What the command does to the machine. `last_working_state` is where a failed one failed."""
    if machine.status not in ALLOWED[command.action]:
        return Rejected(
            RejectReason.REFUSED_COMMAND,
            f"cannot {command.action.value} a {machine.status.value} machine",
        )
    decided = _decide_command(definition, machine, command, last_working_state)
    return decided if isinstance(decided, Rejected) else typed(definition, decided)


def _decide_command(
    definition: MachineDefinition,
    machine: Machine,
    command: Command,
    last_working_state: str | None,
) -> Transition | Rejected:
    base = Transition(
        from_state=machine.current_state,
        to_state=machine.current_state,
        success=True,
        status=machine.status,
        context=dict(machine.context),
        attempt=machine.attempt + 1,
        state_retries=machine.state_retries,
        output=None,
        error=None,
    )
    if command.action is Action.PAUSE:
        return replace(base, status=MachineStatus.PAUSED)
    if command.action is Action.RESUME:
        return replace(base, status=MachineStatus.RUNNING)
    if command.action is Action.CANCEL:
        return replace(base, status=MachineStatus.CANCELLED)
    if command.action is Action.RETRY:
        return _retry(definition, machine, base, last_working_state)
    return _force(definition, base, command.target)


def _retry(
    definition: MachineDefinition,
    machine: Machine,
    base: Transition,
    last_working_state: str | None,
) -> Transition | Rejected:
    state = machine.current_state
    if definition.state(state).terminal is not None:
        if last_working_state is None:
            return Rejected(RejectReason.REFUSED_COMMAND, f"{state} has no state to retry")
        state = last_working_state
    return replace(base, to_state=state, status=MachineStatus.RUNNING, state_retries=0)


def _force(
    definition: MachineDefinition, base: Transition, target: str | None
) -> Transition | Rejected:
    names = [s.name for s in definition.states]
    if target not in names:
        return Rejected(
            RejectReason.REFUSED_COMMAND,
            f"force needs a target state of {definition.type}: one of {', '.join(names)}; "
            f"got {target!r}",
        )
    status = status_in(definition, target)
    return replace(base, to_state=target, status=status, state_retries=0)


def decide_rewind(
    definition: MachineDefinition, machine: Machine, state: str, context: dict[str, object]
) -> Transition | Rejected:
    """Back to a state the machine was in, with the context it had there (and an operator's
    edits): a new attempt of that state, whatever the machine's status (a finished one runs
    again). A state that ends the machine is no place to go back to."""
    if definition.state(state).terminal is not None:
        return Rejected(
            RejectReason.REFUSED_COMMAND,
            f"that step ended the machine in {state}: rewind to a step before it",
        )
    return typed(
        definition,
        Transition(
            from_state=machine.current_state,
            to_state=state,
            success=True,
            status=MachineStatus.RUNNING,
            context=dict(context),
            attempt=machine.attempt + 1,
            state_retries=0,
            output=None,
            error=None,
        ),
    )
