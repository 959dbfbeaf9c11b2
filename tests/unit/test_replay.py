"""Replay (fsm_celery.core.replay): a recorded history run again through the core against a
definition. Properties over the shipped definitions and random runs: the definition that
recorded a run takes its path step by step; a negated guard diverges exactly at the first step
whose edge it changes, and says which guard; a renamed state, at the first step that went
there; a newly required key, at the first answer without it. And the cases one by one: a budget
pause kept, commands and rewinds replayed, rows recorded before their failure kind, the reasons
a history cannot be replayed."""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsm_celery.core import timeline
from fsm_celery.core.admin import Action, Command, decide_command, decide_rewind
from fsm_celery.core.attempt_events import Ack, Event, GateDecided, Timeout
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.loader import load_text
from fsm_celery.core.replay import Outcome, Row, failure_of, replay
from fsm_celery.core.transition import Machine, MachineStatus, Transition, decide
from fsm_celery.core.usage import Budget
from tests.support import FIXTURE_DEFINITIONS
from tests.unit.conftest import DEFINITIONS, after, machine_in
from tests.unit.test_properties import ANY_OUTCOME, IDS, PROPERTY, SHIPPED, fitting_event

TEXTS = {d.type: (DEFINITIONS / f"{d.type}.yaml").read_text() for d in SHIPPED}
GUARDS = [
    (d.type, edge.when)
    for d in SHIPPED
    for s in d.states
    for edge in s.on_success
    if edge.when is not None
]
NAMES = {Ack: "ack", Timeout: "timeout", GateDecided: "approval"}


def row_of(machine: Machine, event: str, t: Transition, **kw: Any) -> Row:
    """The history row the engine writes for the transition (store.writes.Writes._history)."""
    return Row(
        attempt=machine.attempt,
        event=event,
        from_state=t.from_state,
        to_state=t.to_state,
        success=t.success,
        output=t.output,
        error=t.error,
        failure=t.failure.value if t.failure is not None else None,
        context_delta=timeline.change(machine.context, t.context) or {},
        **kw,
    )


def start_row(machine: Machine, event: str = "start") -> Row:
    return Row(
        attempt=0,
        event=event,
        from_state=None,
        to_state=machine.current_state,
        success=True,
        context_delta=timeline.started(machine.context),
    )


def record(
    data: st.DataObject, d: MachineDefinition
) -> tuple[list[Row], list[tuple[Machine, Event]], Machine]:
    """A random run of the definition, as its history records it: the rows, each step's machine
    and event, and the machine it ends as."""
    m = machine_in(d, d.initial_state)
    rows, steps = [start_row(m)], []
    for _ in range(60):
        if m.status is not MachineStatus.RUNNING:
            break
        event = fitting_event(data, d, m, ANY_OUTCOME)
        t = decide(d, m, event)
        assert isinstance(t, Transition)
        rows.append(row_of(m, NAMES[type(event)], t))
        steps.append((m, event))
        m = after(m, t)
    return rows, steps, m


def _negated(text: str, guard: str) -> MachineDefinition:
    line = f"when: {guard}\n"
    assert text.count(line) == 1, guard
    return load_text(text.replace(line, f'when: "!({guard})"\n'))


def _renamed(text: str, state: str, to: str) -> MachineDefinition:
    return load_text(re.sub(rf"\b{state}\b", to, text))


# -- properties over the shipped definitions --------------------------------------------------


@pytest.mark.parametrize("d", SHIPPED, ids=IDS)
@PROPERTY
@given(data=st.data())
def test_the_definition_that_recorded_a_run_takes_its_path(
    d: MachineDefinition, data: st.DataObject
) -> None:
    rows, _, m = record(data, d)
    found = replay(d, rows, status=m.status.value)
    assert found.outcome is Outcome.SAME, found.why
    assert [s.replayed for s in found.steps] == [r.to_state for r in rows]
    assert found.status == m.status.value


@pytest.mark.parametrize(("type_", "guard"), GUARDS, ids=[f"{t}:{g}" for t, g in GUARDS])
@PROPERTY
@given(data=st.data())
def test_a_negated_guard_diverges_at_the_first_step_it_changes(
    type_: str, guard: str, data: st.DataObject
) -> None:
    d = next(x for x in SHIPPED if x.type == type_)
    changed = _negated(TEXTS[type_], guard)
    rows, steps, m = record(data, d)
    expected = None  # the oracle: the first step the changed definition decides elsewhere
    for (before, event), row in zip(steps, rows[1:], strict=True):
        now = decide(changed, before, event)
        if not isinstance(now, Transition) or now.to_state != row.to_state:
            expected = row.attempt
            break
    found = replay(changed, rows, status=m.status.value)
    if expected is None:
        assert found.outcome is Outcome.SAME, found.why
        return
    assert found.outcome is Outcome.DIVERGED
    assert found.at == expected, (found.why, expected)
    assert f"guard {f'!({guard})'!r}" in (found.why or ""), found.why  # loop limit or not
    assert all(s.same for s in found.steps[:-1])


@pytest.mark.parametrize("d", SHIPPED, ids=IDS)
@PROPERTY
@given(data=st.data())
def test_a_renamed_state_diverges_at_the_first_step_that_went_there(
    d: MachineDefinition, data: st.DataObject
) -> None:
    kept = (d.initial_state, d.on_loop_exhausted)  # named by default where they are not written
    state = data.draw(st.sampled_from([s.name for s in d.states if s.name not in kept]))
    changed = _renamed(TEXTS[d.type], state, "RENAMED")
    rows, _, m = record(data, d)
    went = [r.attempt for r in rows if r.to_state == state]
    found = replay(changed, rows, status=m.status.value)
    if not went:
        assert found.outcome is Outcome.SAME, found.why
        return
    assert found.outcome is Outcome.DIVERGED
    assert found.at == went[0]
    assert found.steps[-1].replayed == "RENAMED"


@pytest.mark.parametrize("d", SHIPPED, ids=IDS)
@PROPERTY
@given(data=st.data())
def test_a_newly_required_key_diverges_at_the_first_answer_without_it(
    d: MachineDefinition, data: st.DataObject
) -> None:
    working = [
        s for s in d.states if s.terminal is None and s.approval is None and s.required_output
    ]
    state = data.draw(st.sampled_from([s.name for s in working]))
    text = TEXTS[d.type]
    rows, _, m = record(data, d)
    first = next(s for s in d.states if s.name == state).required_output[0]
    changed = _required(text, state, first, "ticketUrl")
    answered = [r.attempt for r in rows if r.event == "ack" and r.from_state == state and r.success]
    found = replay(changed, rows, status=m.status.value)
    if not answered:
        assert found.outcome is Outcome.SAME, found.why
        return
    assert found.outcome is Outcome.DIVERGED
    assert found.at == answered[0]
    assert "missing required output: ticketUrl" in (found.why or "")


def _required(text: str, state: str, first: str, key: str) -> MachineDefinition:
    """The definition with `key` required of the state as well (its list starts with `first`)."""
    d = load_text(text)
    at = text.index(f"name: {state}\n")
    head, tail = text[:at], text[at:]
    tail = re.sub(
        rf"required_output: \[{first}\b", f"required_output: [{key}, {first}", tail, count=1
    )
    changed = load_text(head + tail)
    assert key in changed.state(state).required_output and d.type == changed.type
    return changed


# -- one case at a time -----------------------------------------------------------------------

LINEAR_TEXT = (FIXTURE_DEFINITIONS / "test_linear.yaml").read_text()
LINEAR = load_text(LINEAR_TEXT)


def _run(d: MachineDefinition, *events: tuple[str, Any]) -> tuple[list[Row], Machine]:
    """Rows for events given by kind: ("ack", output), ("fail", error), ("timeout", None),
    (an Action's value, its target)."""
    m = machine_in(d, d.initial_state)
    rows = [start_row(m)]
    for kind, arg in events:
        if kind in {a.value for a in Action}:
            t = decide_command(d, m, Command(Action(kind), "ops", "why", arg), rows[-1].from_state)
            name = kind
        elif kind == "timeout":
            t, name = decide(d, m, Timeout(m.current_state, m.attempt)), "timeout"
        else:
            ok = kind == "ack"
            ack = Ack(m.current_state, m.attempt, ok, arg if ok else {}, None if ok else arg)
            t, name = decide(d, m, ack), "ack"
        assert isinstance(t, Transition), t
        rows.append(row_of(m, name, t, actor="ops" if name != "ack" else None))
        m = after(m, t)
    return rows, m


def test_a_changed_guard_is_named_with_where_each_edge_goes() -> None:
    d = next(x for x in SHIPPED if x.type == "research_pipeline")
    m = machine_in(d, d.initial_state)
    rows = [start_row(m)]
    outputs: dict[str, dict[str, Any]] = {
        "PLANNING": {"taskState": {}, "plan": "p"},
        "RESEARCHING": {"taskState": {}},
        "ANALYZING": {"taskState": {}},
        "REVIEWING": {"taskState": {}, "approved": True},
    }
    while m.status is MachineStatus.RUNNING:
        state = d.state(m.current_state)
        output = {k: outputs.get(state.name, {}).get(k, "x") for k in state.required_output}
        t = decide(d, m, Ack(m.current_state, m.attempt, True, output))
        assert isinstance(t, Transition)
        rows.append(row_of(m, "ack", t))
        m = after(m, t)
    assert m.current_state == "COMPLETE"
    found = replay(
        _negated(TEXTS["research_pipeline"], "output.approved"), rows, status="completed"
    )
    assert found.outcome is Outcome.DIVERGED
    step = found.steps[-1]
    assert (step.state, step.recorded, step.replayed) == ("REVIEWING", "COMPLETE", "ANALYZING")
    assert found.why == (
        "REVIEWING: → ANALYZING now, the run went → COMPLETE: "
        "guard '!(output.approved)' → COMPLETE is false; the default edge → ANALYZING is taken"
    )


def test_failures_retries_and_commands_replay_and_a_changed_retry_count_diverges() -> None:
    rows, m = _run(
        LINEAR,
        ("ack", {"one": 1}),
        ("fail", "flaky"),  # TWO retried
        ("timeout", None),  # TWO retried again
        ("pause", None),
        ("resume", None),
        ("ack", {"two": 2}),
        ("force", "DONE"),
    )
    assert replay(LINEAR, rows, status=m.status.value).outcome is Outcome.SAME
    once = load_text(LINEAR_TEXT.replace("max_retries: 10", "max_retries: 1"))
    found = replay(once, rows, status=m.status.value)
    assert found.outcome is Outcome.DIVERGED and found.at == 3
    assert found.why == ("TWO: → FAILED now, the run went → TWO (timed out)"), found.why


def test_a_force_to_a_state_removed_is_refused_now() -> None:
    rows, m = _run(LINEAR, ("ack", {"one": 1}), ("force", "THREE"), ("ack", {"three": 3}))
    changed = _renamed(LINEAR_TEXT, "THREE", "LAST")
    found = replay(changed, rows, status=m.status.value)
    assert found.outcome is Outcome.DIVERGED and found.at == 2
    assert "force needs a target state" in (found.why or "")


def test_a_state_renamed_at_the_start_diverges_at_the_start() -> None:
    rows, _ = _run(LINEAR, ("ack", {"one": 1}))
    found = replay(_renamed(LINEAR_TEXT, "ONE", "FIRST"), rows)
    assert found.outcome is Outcome.DIVERGED and found.at == 0
    assert found.why == "ONE is not a state of the definition now (renamed or removed)"


def test_a_terminal_that_now_fails_is_the_last_steps_divergence() -> None:
    rows, m = _run(LINEAR, ("ack", {"one": 1}), ("ack", {"two": 2}), ("ack", {"three": 3}))
    assert m.status is MachineStatus.COMPLETED
    changed = load_text(LINEAR_TEXT.replace("terminal: completed", "terminal: failed"))
    found = replay(changed, rows, status="completed")
    assert found.outcome is Outcome.DIVERGED and found.at == 3
    assert found.why == "the machine ends failed in DONE now; the run is completed"


def test_a_loop_counted_now_is_a_context_divergence() -> None:
    text = LINEAR_TEXT.replace(
        "    on_success: THREE\n", "    on_success: {target: THREE, loop: true}\n"
    )
    rows, m = _run(LINEAR, ("ack", {"one": 1}), ("ack", {"two": 2}))
    found = replay(load_text(text), rows, status=m.status.value)
    assert found.outcome is Outcome.DIVERGED and found.at == 2
    assert found.why == "the context after it differs: retryCount: 0 in the run, 1 now"


def test_a_rewind_replays_with_its_context() -> None:
    rows, m = _run(LINEAR, ("ack", {"one": 1}), ("ack", {"two": 2}))
    context = {**timeline.contexts(r.context_delta for r in rows)[1], "hint": "v2"}
    t = decide_rewind(LINEAR, m, "TWO", context)
    assert isinstance(t, Transition)
    rows.append(replace(row_of(m, "rewind", t), actor="ops"))
    m = after(m, t)
    assert replay(LINEAR, rows, status=m.status.value).outcome is Outcome.SAME
    found = replay(_renamed(LINEAR_TEXT, "TWO", "SECOND"), rows)
    assert found.outcome is Outcome.DIVERGED and found.at == 1


def test_a_step_its_budget_paused_stays_paused() -> None:
    budget = load_text(LINEAR_TEXT)
    m = replace(machine_in(budget, "ONE"), budget=Budget(tokens=5))
    t = decide(budget, m, Ack("ONE", 1, True, {"one": 1, "tokensUsed": 9}))
    assert isinstance(t, Transition) and t.status is MachineStatus.PAUSED
    rows = [start_row(m), row_of(m, "ack", t)]
    paused = after(m, t)
    assert replay(budget, rows, status="paused").outcome is Outcome.SAME
    c = decide_command(budget, paused, Command(Action.RESUME, "ops"))
    assert isinstance(c, Transition)
    rows.append(row_of(paused, "resume", c, actor="ops"))
    assert replay(budget, rows, status="running").outcome is Outcome.SAME


def test_rows_recorded_before_their_failure_kind_are_read_from_the_error() -> None:
    refused = Row(1, "ack", "ONE", "ONE", False, {}, "missing required output: one (retry 1 of 10)")
    failed = Row(1, "ack", "ONE", "ONE", False, {}, "missing required output (retry 1 of 10)")
    guard = Row(1, "ack", "A", "A", False, {}, "guard 'x' failed on the output: TypeError: y")
    assert failure_of(refused).value == "invalid_output"  # type: ignore[union-attr]
    assert failure_of(guard).value == "invalid_output"  # type: ignore[union-attr]
    assert failure_of(failed).value == "failure"  # type: ignore[union-attr]
    rows, m = _run(LINEAR, ("ack", {"nope": 1}), ("ack", {"one": 1}))
    old = [replace(r, failure=None) for r in rows]
    assert rows[1].failure == "invalid_output"
    assert replay(LINEAR, old, status=m.status.value).outcome is Outcome.SAME


def test_what_cannot_be_replayed_says_why() -> None:
    rows, _ = _run(LINEAR, ("ack", {"one": 1}), ("ack", {"two": 2}))
    assert replay(LINEAR, []).why == "no history is recorded"
    unknown = replay(LINEAR, [replace(rows[0], context_delta=None), *rows[1:]])
    assert unknown.outcome is Outcome.UNREPLAYABLE and "migration 0014" in (unknown.why or "")
    gap = replay(LINEAR, [rows[0], rows[2]])
    assert gap.outcome is Outcome.UNREPLAYABLE and gap.at == 1
    assert gap.why == "step 1 is missing from its history (the next is 2)"
    odd = replay(LINEAR, [rows[0], replace(rows[1], event="teleport")])
    assert (
        odd.outcome is Outcome.UNREPLAYABLE
        and odd.why == "a 'teleport' step is not one replay knows"
    )


def test_a_changed_guard_that_runs_into_the_loop_limit_names_both() -> None:
    d = next(x for x in SHIPPED if x.type == "cto_fix_bug")
    outputs: dict[str, dict[str, Any]] = {
        "ANALYZE_BUG": {"reproduced": True},
        "LOCATE_CODE": {"location": "x"},
        "WRITE_FIX": {"filesChanged": ["x"]},
        "COMMIT_PUSH": {"commitHash": "abc"},
        "DEPLOY": {"deploymentUrl": "u"},
    }
    m = machine_in(d, d.initial_state)
    rows = [start_row(m)]
    fails = 3  # RUN_TESTS fails three times: each a loop back to WRITE_FIX, its limit reached
    while m.status is MachineStatus.RUNNING:
        state = m.current_state
        if state == "RUN_TESTS" and fails:
            fails -= 1
            ack = Ack(state, m.attempt, False, {}, "tests crashed")
        else:
            ack = Ack(state, m.attempt, True, outputs.get(state, {"passed": True}))
        t = decide(d, m, ack)
        assert isinstance(t, Transition)
        rows.append(row_of(m, "ack", t))
        m = after(m, t)
    assert m.current_state == "COMPLETE"
    found = replay(_negated(TEXTS["cto_fix_bug"], "output.passed"), rows, status="completed")
    assert found.outcome is Outcome.DIVERGED
    assert found.why == (
        "RUN_TESTS: → FAILED now, the run went → COMMIT_PUSH: guard '!(output.passed)' → "
        "COMMIT_PUSH is false; the default edge → WRITE_FIX is taken (loop limit reached: 4 "
        "loops back to WRITE_FIX, maxRetries=3)"
    )
