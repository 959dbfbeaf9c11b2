"""A refused answer: an agent's success ack whose output breaks its state's contract goes back to
the agent to correct, within the same attempt (its deadline runs on), up to the state's bound of
corrections; past it, the core decides the answer as any other (an INVALID_OUTPUT failure, the
retry policy applies). Pure: a value, as transition.decide's."""

from __future__ import annotations

from dataclasses import dataclass

from fsm_celery.core.attempt_events import Ack
from fsm_celery.core.contract import Flaw, state_flaws
from fsm_celery.core.definition import MachineDefinition, StateDefinition
from fsm_celery.core.transition import Limits, Machine, check_event

REFUSED = "refused"  # the event of a refusal's history row


@dataclass(frozen=True)
class Refusal:
    """The answer goes back to its agent with its problems; the machine stays where it is."""

    state: str
    attempt: int
    flaws: tuple[Flaw, ...]
    corrections_left: int  # corrected answers still allowed after this one
    correction: int  # its number within the attempt (1: the first)


def allowed(state: StateDefinition, limits: Limits) -> int:
    """How many refused answers an attempt of the state may correct."""
    return state.max_corrections if state.max_corrections is not None else limits.max_corrections


def refusal(
    definition: MachineDefinition, machine: Machine, ack: Ack, limits: Limits
) -> Refusal | None:
    """The refusal of the ack, or None: it is decided as any other (a failure, a message for
    another attempt, an answer that holds to its contract, or the corrections used up)."""
    if not ack.success or check_event(machine, ack.state, ack.attempt) is not None:
        return None
    state = definition.state(machine.current_state)
    if state.awaits or state.fans_out or state.terminal is not None:
        return None  # no agent answers it: decide() rejects the ack
    most = allowed(state, limits)
    if machine.corrections >= most:
        return None
    found = state_flaws(state, ack.output)
    if not found:
        return None
    used = machine.corrections + 1
    return Refusal(state.name, machine.attempt, found, most - used, used)
