"""Properties of decide() over the shipped definitions, driven by random event sequences.

Whatever the agents answer, a machine only moves along its definition's edges (or retries the
state it is in), one attempt per transition; events that do not fit change nothing; and every
run ends in a terminal state within a bound fixed by the retries and the loop limit.
"""

from __future__ import annotations

import copy
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm_celery.core import gate
from fsm_celery.core.attempt_events import Ack, Event, GateDecided, Timeout
from fsm_celery.core.definition import MachineDefinition, Terminal
from fsm_celery.core.loader import definition_files, load_all
from fsm_celery.core.transition import (
    Machine,
    MachineStatus,
    Rejected,
    RejectReason,
    Transition,
    decide,
)
from tests.unit.conftest import DEFINITIONS, after, machine_in

SHIPPED = load_all(definition_files(DEFINITIONS))
IDS = [d.type for d in SHIPPED]
ANY_OUTCOME = ["success", "success", "success", "failure", "timeout", "missing"]
FAILURES = ["failure", "timeout", "missing"]
OTHER_VALUES = st.booleans() | st.integers() | st.text(max_size=3) | st.none()
PROPERTY = settings(
    max_examples=80, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)


def guard_keys(d: MachineDefinition) -> set[str]:
    """The output keys the definition's guards read (needsSpec, passed, verified, approved)."""
    return {
        key
        for s in d.states
        for e in s.on_success
        if e.when
        for key in re.findall(r"output\.(\w+)", e.when)
    }


def run_bound(d: MachineDefinition) -> int:
    """A generous bound on the transitions of a run: every loop pass (max_loops of them, the
    first pass, and the pass the exhausted loop ends) visits each state with all its retries."""
    visits = sum(s.max_retries + 1 for s in d.states if s.terminal is None)
    return (d.max_loops + 2) * visits


def allowed_targets(d: MachineDefinition, state: str) -> set[str]:
    s = d.state(state)
    targets = {edge.target for edge in s.edges}
    if any(edge.loop for edge in s.edges):
        targets.add(d.on_loop_exhausted)
    return targets


def is_terminal(d: MachineDefinition, state: str) -> bool:
    return d.state(state).terminal is not None


# -- events -----------------------------------------------------------------------------------


def fitting_event(data: st.DataObject, d: MachineDefinition, m: Machine, kinds: list[str]) -> Event:
    """An event for the machine's current state and attempt, of one of the kinds."""
    state, attempt = m.current_state, m.attempt
    kind = data.draw(st.sampled_from(kinds))
    if kind == "timeout":
        return Timeout(state, attempt)
    if d.state(state).approval is not None:  # people decide it: approve, or reject
        verdict = gate.Verdict.APPROVED if kind == "success" else gate.Verdict.REJECTED
        summary = gate.summary(verdict, [("someone", verdict.value, "", False)])
        return GateDecided(state, attempt, kind == "success", summary)
    if kind == "failure":
        return Ack(state, attempt, False, {}, data.draw(st.none() | st.just("boom")))
    guarded = guard_keys(d)
    required = list(d.state(state).required_output)
    output = {key: data.draw(st.booleans() if key in guarded else OTHER_VALUES) for key in required}
    if kind == "missing":
        if not required:  # nothing can be missing: fail instead
            return Ack(state, attempt, False)
        for key in data.draw(st.lists(st.sampled_from(required), min_size=1, unique=True)):
            del output[key]
    return Ack(state, attempt, True, output)


def misfit_event(
    data: st.DataObject, d: MachineDefinition, m: Machine
) -> tuple[Event, RejectReason]:
    """An event that must be rejected: stale, never dispatched, or for another state."""
    state, attempt = m.current_state, m.attempt
    if m.status is not MachineStatus.RUNNING:
        return Ack(state, attempt, True, {}), RejectReason.NOT_RUNNING
    kind = data.draw(st.sampled_from(["stale", "future", "wrong_state"]))
    timeout = data.draw(st.booleans())
    if kind == "wrong_state":
        other = data.draw(st.sampled_from([s.name for s in d.states if s.name != state]))
        event: Event = Timeout(other, attempt) if timeout else Ack(other, attempt, True, {})
        return event, RejectReason.WRONG_STATE
    shift = data.draw(st.integers(1, 3))
    at = attempt - shift if kind == "stale" else attempt + shift
    reason = RejectReason.STALE_ATTEMPT if kind == "stale" else RejectReason.UNKNOWN_ATTEMPT
    return (Timeout(state, at) if timeout else Ack(state, at, True, {})), reason


# -- the invariants of one step ---------------------------------------------------------------


def check_transition(d: MachineDefinition, m: Machine, t: Transition) -> None:
    state = d.state(m.current_state)
    assert t.from_state == m.current_state
    assert t.attempt == m.attempt + 1, "each transition is exactly one attempt"
    assert t.success is (t.failure is None)
    retried = t.to_state == m.current_state and t.failure is not None
    if retried:
        assert t.failure in state.retry_on
        assert t.state_retries == m.state_retries + 1 <= state.max_retries
    else:
        assert t.to_state in allowed_targets(d, m.current_state), (m.current_state, t.to_state)
        assert t.state_retries == 0
    terminal = d.state(t.to_state).terminal
    assert (t.status is MachineStatus.RUNNING) is (terminal is None)
    if terminal is not None:
        expected = (
            MachineStatus.COMPLETED if terminal is Terminal.COMPLETED else MachineStatus.FAILED
        )
        assert t.status is expected
        assert not t.enters_state


def step(d: MachineDefinition, m: Machine, event: Event) -> Machine:
    """Decide a fitting event, check the transition, and return the machine it leaves."""
    before = copy.deepcopy(m)
    decision = decide(d, m, event)
    assert m == before, "decide must not change its input"
    assert isinstance(decision, Transition), (event, decision)
    check_transition(d, m, decision)
    return after(m, decision)


def reject(d: MachineDefinition, m: Machine, event: Event, reason: RejectReason) -> None:
    before = copy.deepcopy(m)
    decision = decide(d, m, event)
    assert isinstance(decision, Rejected), (event, decision)
    assert decision.reason is reason
    assert m == before, "a rejected event changes nothing"


def assert_finished_or_waiting(d: MachineDefinition, m: Machine) -> None:
    if is_terminal(d, m.current_state):
        assert m.status in (MachineStatus.COMPLETED, MachineStatus.FAILED)
    else:
        assert m.status is MachineStatus.RUNNING
        assert isinstance(decide(d, m, Timeout(m.current_state, m.attempt)), Transition)


# -- the properties ---------------------------------------------------------------------------


@pytest.mark.parametrize("d", SHIPPED, ids=IDS)
@PROPERTY
@given(data=st.data())
def test_any_event_sequence_follows_the_definition(
    d: MachineDefinition, data: st.DataObject
) -> None:
    m = machine_in(d, d.initial_state)
    for _ in range(data.draw(st.integers(0, 40), label="events")):
        if m.status is not MachineStatus.RUNNING or data.draw(st.integers(0, 3)) == 0:
            event, reason = misfit_event(data, d, m)
            reject(d, m, event, reason)
        else:
            m = step(d, m, fitting_event(data, d, m, ANY_OUTCOME))
        assert (m.status is MachineStatus.RUNNING) is not is_terminal(d, m.current_state)
    assert_finished_or_waiting(d, m)


@pytest.mark.parametrize("d", SHIPPED, ids=IDS)
@PROPERTY
@given(data=st.data())
def test_any_run_ends_in_a_terminal_within_the_bound(
    d: MachineDefinition, data: st.DataObject
) -> None:
    m = machine_in(d, d.initial_state)
    steps = 0
    while m.status is MachineStatus.RUNNING and steps <= run_bound(d):
        if data.draw(st.integers(0, 4)) == 0:
            event, reason = misfit_event(data, d, m)
            reject(d, m, event, reason)
        m = step(d, m, fitting_event(data, d, m, ANY_OUTCOME))
        steps += 1
    assert is_terminal(d, m.current_state), f"still running after {steps} transitions"
    assert steps <= run_bound(d) <= d.step_bound()


@pytest.mark.parametrize("d", SHIPPED, ids=IDS)
@PROPERTY
@given(data=st.data())
def test_only_failures_end_in_a_terminal_within_the_bound(
    d: MachineDefinition, data: st.DataObject
) -> None:
    # Start anywhere, part-way through the retries and the loops: from the initial state alone
    # most definitions fail at once.
    state = data.draw(st.sampled_from([s for s in d.states if s.terminal is None]))
    m = machine_in(
        d,
        state.name,
        attempt=data.draw(st.integers(1, 50)),
        retries=data.draw(st.integers(0, state.max_retries)),
        context={"retryCount": data.draw(st.integers(0, d.max_loops))},
    )
    steps = 0
    while m.status is MachineStatus.RUNNING and steps <= run_bound(d):
        m = step(d, m, fitting_event(data, d, m, FAILURES))
        steps += 1
    assert is_terminal(d, m.current_state), f"still running after {steps} failures"
    assert steps <= run_bound(d)


def test_the_guard_keys_of_the_shipped_definitions() -> None:
    assert {d.type: guard_keys(d) for d in SHIPPED} == {
        "cto_build_parallel": {"needsSpec", "passed", "verified"},
        "cto_build_project": {"needsSpec", "passed", "verified"},
        "cto_fix_bug": {"passed"},
        "cto_infrastructure_check": set(),
        "research_fanout": {"approved"},
        "research_pipeline": {"approved"},
    }
