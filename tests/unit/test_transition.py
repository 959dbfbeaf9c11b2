"""The transition decision: every kind of edge, retry, loop bound and rejection."""

from __future__ import annotations

import pytest

from fsm_celery.core.definition import FailureKind, MachineDefinition
from fsm_celery.core.loader import load_text
from fsm_celery.core.transition import (
    Ack,
    MachineStatus,
    Rejected,
    RejectReason,
    Timeout,
    Transition,
    decide,
    initial_context,
)
from tests.unit.conftest import after, machine_in

ANALYSIS = {"needsSpec": True, "complexity": "high"}


def transition(d: MachineDefinition, machine: object, event: object) -> Transition:
    decision = decide(d, machine, event)  # type: ignore[arg-type]
    assert isinstance(decision, Transition), decision
    return decision


def test_guarded_edge_taken_when_its_guard_holds(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "ANALYZE_ISSUE")
    t = transition(build_project, m, Ack("ANALYZE_ISSUE", 1, True, ANALYSIS))
    assert (t.from_state, t.to_state, t.success, t.status) == (
        "ANALYZE_ISSUE",
        "WRITE_SPEC",
        True,
        MachineStatus.RUNNING,
    )


def test_default_edge_taken_when_no_guard_holds(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "ANALYZE_ISSUE")
    t = transition(
        build_project, m, Ack("ANALYZE_ISSUE", 1, True, {**ANALYSIS, "needsSpec": False})
    )
    assert t.to_state == "CREATE_PROJECT"


def test_guard_can_read_the_context() -> None:
    d = load_text("""
type: guarded
agent_type: x
initial_state: A
states:
  - name: A
    on_success:
      - {target: FAST, when: "context.priority == 'high'"}
      - {target: SLOW}
    on_failure: END
  - {name: FAST, terminal: completed}
  - {name: SLOW, terminal: completed}
  - {name: END, terminal: failed}
""")
    urgent = machine_in(d, "A", context={"priority": "high"})
    assert transition(d, urgent, Ack("A", 1, True, {})).to_state == "FAST"
    assert transition(d, machine_in(d, "A"), Ack("A", 1, True, {})).to_state == "SLOW"


def test_output_merges_into_the_context(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "ANALYZE_ISSUE", context={"projectName": "sla-api"})
    t = transition(build_project, m, Ack("ANALYZE_ISSUE", 1, True, ANALYSIS))
    assert t.context == {"projectName": "sla-api", "retryCount": 0, "maxRetries": 3, **ANALYSIS}
    assert t.output == ANALYSIS


def test_success_moves_to_the_next_attempt(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_SPEC", attempt=4, retries=1)
    t = transition(build_project, m, Ack("WRITE_SPEC", 4, True, {"specPath": "/s.md"}))
    assert (t.attempt, t.state_retries, t.enters_state) == (5, 0, True)


def test_failure_with_retries_left_retries_the_state(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=3)
    t = transition(build_project, m, Ack("WRITE_CODE", 3, False, {}, "compiler crashed"))
    assert (t.from_state, t.to_state, t.success) == ("WRITE_CODE", "WRITE_CODE", False)
    assert (t.attempt, t.state_retries, t.failure) == (4, 1, FailureKind.FAILURE)
    assert t.error == "compiler crashed (retry 1 of 2)"
    assert t.delay_seconds >= 0


def test_failure_without_retries_left_takes_the_failure_edge(
    build_project: MachineDefinition,
) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=3, retries=2)
    t = transition(build_project, m, Ack("WRITE_CODE", 3, False, {}, "compiler crashed"))
    assert (t.to_state, t.status, t.error) == ("FAILED", MachineStatus.FAILED, "compiler crashed")
    assert not t.enters_state


def test_failed_output_does_not_merge_into_the_context(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_CODE", retries=2)
    t = transition(build_project, m, Ack("WRITE_CODE", 1, False, {"filesCreated": ["x"]}))
    assert "filesCreated" not in t.context
    assert t.output == {"filesCreated": ["x"]}


def test_retry_on_limits_retries_to_the_listed_failures(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS")  # retries timeouts only
    failed = transition(build_project, m, Ack("RUN_TESTS", 1, False, {}, "3 tests failed"))
    assert failed.to_state == "WRITE_CODE"
    timed_out = transition(build_project, m, Timeout("RUN_TESTS", 1))
    assert (timed_out.to_state, timed_out.failure) == ("RUN_TESTS", FailureKind.TIMEOUT)


def test_missing_required_output_fails_the_attempt(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "ANALYZE_ISSUE")
    t = transition(build_project, m, Ack("ANALYZE_ISSUE", 1, True, {"summary": "?"}))
    assert (t.to_state, t.success, t.failure) == (
        "ANALYZE_ISSUE",
        False,
        FailureKind.INVALID_OUTPUT,
    )
    assert t.error == "missing required output: needsSpec, complexity (retry 1 of 2)"


def test_timeout_is_a_failure(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "DEPLOY_PROD", retries=2)
    t = transition(build_project, m, Timeout("DEPLOY_PROD", 1))
    assert (t.to_state, t.error, t.failure) == ("FAILED", "timed out", FailureKind.TIMEOUT)


def test_loop_edge_counts_in_the_context(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS")
    t = transition(build_project, m, Ack("RUN_TESTS", 1, True, {"passed": False}))
    assert (t.to_state, t.success, t.context["retryCount"]) == ("WRITE_CODE", True, 1)


def test_loop_past_the_bound_goes_to_on_loop_exhausted(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS", context={"retryCount": 3})
    t = transition(build_project, m, Ack("RUN_TESTS", 1, False, {}, "tests failed"))
    assert (t.to_state, t.status) == ("FAILED", MachineStatus.FAILED)
    assert t.error == ("tests failed; loop limit reached: 4 loops back to WRITE_CODE, maxRetries=3")


def test_caller_can_set_the_loop_bound(build_project: MachineDefinition) -> None:
    assert initial_context(build_project, {"maxRetries": 9})["maxRetries"] == 9
    m = machine_in(build_project, "RUN_TESTS", context={"retryCount": 3, "maxRetries": 9})
    assert transition(build_project, m, Ack("RUN_TESTS", 1, False, {})).to_state == "WRITE_CODE"


def test_success_into_a_terminal_completes(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "DEPLOY_PROD")
    t = transition(build_project, m, Ack("DEPLOY_PROD", 1, True, {"prodUrl": "https://x"}))
    assert (t.to_state, t.status, t.enters_state) == ("COMPLETE", MachineStatus.COMPLETED, False)


@pytest.mark.parametrize(
    ("event", "reason"),
    [
        (Ack("WRITE_CODE", 4, True, {}), RejectReason.STALE_ATTEMPT),
        (Ack("WRITE_CODE", 6, True, {}), RejectReason.UNKNOWN_ATTEMPT),
        (Ack("RUN_TESTS", 5, True, {}), RejectReason.WRONG_STATE),
        (Timeout("WRITE_CODE", 4), RejectReason.STALE_ATTEMPT),
    ],
)
def test_events_that_do_not_fit_are_rejected(
    build_project: MachineDefinition, event: object, reason: RejectReason
) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=5)
    decision = decide(build_project, m, event)  # type: ignore[arg-type]
    assert isinstance(decision, Rejected) and decision.reason is reason


@pytest.mark.parametrize("status", [MachineStatus.PAUSED, MachineStatus.CANCELLED])
def test_acks_for_a_machine_that_is_not_running_are_rejected(
    build_project: MachineDefinition, status: MachineStatus
) -> None:
    m = machine_in(build_project, "WRITE_CODE", status=status)
    decision = decide(build_project, m, Ack("WRITE_CODE", 1, True, {"filesCreated": []}))
    assert isinstance(decision, Rejected) and decision.reason is RejectReason.NOT_RUNNING


def test_the_same_ack_twice_is_applied_once(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "COMMIT_PUSH")
    ack = Ack("COMMIT_PUSH", 1, True, {"commitHash": "abc"})
    moved = after(m, transition(build_project, m, ack))
    again = decide(build_project, moved, ack)
    assert isinstance(again, Rejected) and again.reason is RejectReason.STALE_ATTEMPT
