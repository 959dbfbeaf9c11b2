"""Property: random acks, failures and timeouts only ever move a machine along its definition,
and every run ends in a terminal state within a bound the definition fixes."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import definition_files, load_all
from fsm_celery.core.transition import (
    Ack,
    Event,
    MachineStatus,
    Rejected,
    Timeout,
    Transition,
    decide,
)
from tests.unit.conftest import after, machine_in

DEFINITIONS = load_all(definition_files(Path(__file__).resolve().parents[2] / "definitions"))
VALID = ["success", "success", "success", "failure", "timeout", "missing"]


def allowed_targets(d: MachineDefinition, state: str) -> set[str]:
    s = d.state(state)
    targets = {edge.target for edge in s.edges}
    if any(edge.loop for edge in s.edges):
        targets.add(d.on_loop_exhausted)
    return targets


def junk_for(draw: st.DrawFn, d: MachineDefinition, state: str, attempt: int) -> Event:
    """An event that must change nothing: a stale attempt, or another state's ack."""
    if draw(st.booleans()):
        return Ack(state, attempt - 1, True, {})
    other = draw(st.sampled_from([s.name for s in d.states if s.name != state]))
    return Ack(other, attempt, True, {})


def event_for(draw: st.DrawFn, d: MachineDefinition, state: str, attempt: int) -> Event:
    """An event for the attempt: success with random output, failure, timeout, missing keys."""
    kind = draw(st.sampled_from(VALID))
    if kind == "timeout":
        return Timeout(state, attempt)
    if kind == "failure":
        return Ack(state, attempt, False, {}, "boom")
    keys = list(d.state(state).required_output)
    if kind == "missing" and keys:
        keys = keys[1:]
    output = {key: draw(st.booleans() | st.text(max_size=5) | st.integers()) for key in keys}
    return Ack(state, attempt, True, output)


@pytest.mark.parametrize("definition", DEFINITIONS, ids=[d.type for d in DEFINITIONS])
@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_random_events_follow_the_definition_and_terminate(
    definition: MachineDefinition, data: st.DataObject
) -> None:
    machine = machine_in(definition, definition.initial_state)
    for _ in range(definition.step_bound()):
        if machine.status is not MachineStatus.RUNNING:
            break
        state, attempt = machine.current_state, machine.attempt
        if data.draw(st.booleans()):
            junk = junk_for(data.draw, definition, state, attempt)
            assert isinstance(decide(definition, machine, junk), Rejected)
        decision = decide(definition, machine, event_for(data.draw, definition, state, attempt))
        assert isinstance(decision, Transition)
        assert decision.from_state == state
        retried = decision.to_state == state and decision.failure is not None
        assert retried or decision.to_state in allowed_targets(definition, state)
        assert decision.attempt == attempt + 1
        terminal = definition.state(decision.to_state).terminal is not None
        assert (decision.status is MachineStatus.RUNNING) is not terminal
        machine = after(machine, decision)
    assert machine.status is not MachineStatus.RUNNING, "the run outlived its bound"
