"""decide(): every edge kind, retries, loop bounds, terminals and rejections."""

from __future__ import annotations

import copy
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fsm_celery.core.attempt_events import Ack, DispatchFailed, Event, HandBack, Timeout
from fsm_celery.core.definition import FailureKind, MachineDefinition
from fsm_celery.core.loader import load_file, load_text
from fsm_celery.core.transition import (
    Limits,
    Machine,
    MachineStatus,
    Rejected,
    RejectReason,
    Transition,
    decide,
    initial_context,
)
from fsm_celery.core.usage import Budget, Usage
from fsm_celery.exceptions import DefinitionError
from tests.unit.conftest import DEFINITIONS, after, machine_in

ANALYSIS = {"needsSpec": True, "complexity": "high"}

# Two guards that can both hold, a default, and a guard on the context.
ROUTER = load_text("""
type: router
agent_type: x
initial_state: ROUTE
states:
  - name: ROUTE
    on_success:
      - {target: FIRST, when: output.a}
      - {target: SECOND, when: output.b}
      - {target: URGENT, when: "context.priority == 'high'"}
      - {target: DEFAULT}
    on_failure: LOST
  - {name: FIRST, terminal: completed}
  - {name: SECOND, terminal: completed}
  - {name: URGENT, terminal: completed}
  - {name: DEFAULT, terminal: failed}
  - {name: LOST, terminal: failed}
""")


@pytest.fixture(scope="module")
def research() -> MachineDefinition:
    return load_file(DEFINITIONS / "research_pipeline.yaml")


def transition(d: MachineDefinition, machine: Machine, event: Event) -> Transition:
    decision = decide(d, machine, event)
    assert isinstance(decision, Transition), decision
    return decision


def rejection(d: MachineDefinition, machine: Machine, event: Event) -> Rejected:
    decision = decide(d, machine, event)
    assert isinstance(decision, Rejected), decision
    return decision


def route(output: dict[str, Any], context: dict[str, Any] | None = None) -> str:
    m = machine_in(ROUTER, "ROUTE", context=context)
    return transition(ROUTER, m, Ack("ROUTE", 1, True, output)).to_state


# -- success edges ----------------------------------------------------------------------------


def test_unguarded_success_edge(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_SPEC", attempt=4)
    t = transition(build_project, m, Ack("WRITE_SPEC", 4, True, {"specPath": "/s.md"}))
    assert (t.from_state, t.to_state, t.success, t.status) == (
        "WRITE_SPEC",
        "CREATE_PROJECT",
        True,
        MachineStatus.RUNNING,
    )
    assert (t.attempt, t.state_retries, t.error, t.failure) == (5, 0, None, None)
    assert t.delay_seconds == 0
    assert t.enters_state


def test_success_resets_the_state_retries(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_SPEC", attempt=4, retries=1)
    t = transition(build_project, m, Ack("WRITE_SPEC", 4, True, {"specPath": "/s.md"}))
    assert t.state_retries == 0


def test_needs_spec_goes_to_write_spec(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "ANALYZE_ISSUE")
    t = transition(build_project, m, Ack("ANALYZE_ISSUE", 1, True, ANALYSIS))
    assert (t.to_state, t.success, t.status) == ("WRITE_SPEC", True, MachineStatus.RUNNING)


def test_no_spec_needed_skips_to_create_project(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "ANALYZE_ISSUE")
    output = {**ANALYSIS, "needsSpec": False}
    assert transition(build_project, m, Ack("ANALYZE_ISSUE", 1, True, output)).to_state == (
        "CREATE_PROJECT"
    )


def test_first_matching_guard_wins() -> None:
    assert route({"a": True, "b": True}) == "FIRST"
    assert route({"a": False, "b": True}) == "SECOND"


def test_default_edge_when_no_guard_matches() -> None:
    assert route({"a": False, "b": False}) == "DEFAULT"


@pytest.mark.parametrize("falsy", [False, None, "", [], {}])
def test_guard_is_false_for_jmespath_false_values(falsy: object) -> None:
    assert route({"a": falsy}) == "DEFAULT"


@pytest.mark.parametrize("truthy", [True, 0, "no", [0], {"k": None}])
def test_guard_is_true_for_jmespath_true_values(truthy: object) -> None:
    assert route({"a": truthy}) == "FIRST"


def test_guard_reads_the_context() -> None:
    assert route({}, context={"priority": "high"}) == "URGENT"
    assert route({}, context={"priority": "low"}) == "DEFAULT"


def test_guard_on_the_context_sees_this_output() -> None:
    assert route({"priority": "high"}) == "URGENT"


def test_guard_that_errors_on_the_output_does_not_crash_decide() -> None:
    # length() of a number is a JMESPath type error at search time, not at compile time.
    d = load_text("""
type: typed
agent_type: x
initial_state: A
states:
  - name: A
    on_success:
      - {target: MANY, when: "length(output.items) > `1`"}
      - {target: FEW}
    on_failure: LOST
  - {name: MANY, terminal: completed}
  - {name: FEW, terminal: completed}
  - {name: LOST, terminal: failed}
""")
    decision = decide(d, machine_in(d, "A"), Ack("A", 1, True, {"items": 5}))
    assert isinstance(decision, Transition)
    assert (decision.to_state, decision.failure) == ("LOST", FailureKind.INVALID_OUTPUT)
    assert decision.error is not None
    assert decision.error.startswith("guard 'length(output.items) > `1`' failed on the output: ")


def test_a_guard_raising_a_python_error_fails_the_attempt_as_invalid_output() -> None:
    # jmespath compares a string with a number by raising TypeError.
    d = load_text("""
type: compare
agent_type: x
initial_state: A
states:
  - name: A
    on_success:
      - {target: BIG, when: "output.n > `3`"}
      - {target: SMALL}
    on_failure: LOST
  - {name: BIG, terminal: completed}
  - {name: SMALL, terminal: completed}
  - {name: LOST, terminal: failed}
""")
    t = transition(d, machine_in(d, "A"), Ack("A", 1, True, {"n": "many"}))
    assert (t.to_state, t.success, t.failure) == ("LOST", False, FailureKind.INVALID_OUTPUT)
    assert t.error is not None and "TypeError" in t.error and "output.n > `3`" in t.error


def test_output_merges_into_the_context(build_project: MachineDefinition) -> None:
    context = {"projectName": "sla-api", "complexity": "low"}
    m = machine_in(build_project, "ANALYZE_ISSUE", context=context)
    t = transition(build_project, m, Ack("ANALYZE_ISSUE", 1, True, ANALYSIS))
    assert t.context == {"projectName": "sla-api", "retryCount": 0, "maxRetries": 3, **ANALYSIS}
    assert t.output == ANALYSIS


def test_decide_leaves_the_machine_untouched(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS", context={"projectPath": "/p"})
    before = copy.deepcopy(m)
    transition(build_project, m, Ack("RUN_TESTS", 1, True, {"passed": False}))
    assert m == before


# -- failures and retries ---------------------------------------------------------------------


def test_failure_with_retries_left_retries_the_same_state(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=3)
    t = transition(build_project, m, Ack("WRITE_CODE", 3, False, {}, "compiler crashed"))
    assert (t.from_state, t.to_state, t.success, t.status) == (
        "WRITE_CODE",
        "WRITE_CODE",
        False,
        MachineStatus.RUNNING,
    )
    assert (t.attempt, t.state_retries, t.failure) == (4, 1, FailureKind.FAILURE)
    assert t.error == "compiler crashed (retry 1 of 2)"


def test_second_retry_counts_on(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=4, retries=1)
    t = transition(build_project, m, Ack("WRITE_CODE", 4, False, {}, "again"))
    assert (t.to_state, t.attempt, t.state_retries, t.error) == (
        "WRITE_CODE",
        5,
        2,
        "again (retry 2 of 2)",
    )


def test_failure_without_an_error_text_says_the_agent_failed(
    build_project: MachineDefinition,
) -> None:
    m = machine_in(build_project, "WRITE_CODE")
    t = transition(build_project, m, Ack("WRITE_CODE", 1, False))
    assert t.error == "the agent reported failure (retry 1 of 2)"


def test_retry_waits_a_jittered_backoff(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=3)
    first = transition(build_project, m, Ack("WRITE_CODE", 3, False))
    again = transition(build_project, m, Ack("WRITE_CODE", 3, False))
    assert 0 <= first.delay_seconds < 1  # default backoff: 1 s, full jitter
    assert first.delay_seconds == again.delay_seconds  # drawn from (machine, attempt)


def test_retries_exhausted_takes_on_failure(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=3, retries=2)
    t = transition(build_project, m, Ack("WRITE_CODE", 3, False, {}, "compiler crashed"))
    assert (t.to_state, t.status, t.success, t.failure) == (
        "FAILED",
        MachineStatus.FAILED,
        False,
        FailureKind.FAILURE,
    )
    assert (t.attempt, t.state_retries, t.error) == (4, 0, "compiler crashed")
    assert not t.enters_state


def test_failure_output_is_recorded_but_not_merged(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_CODE", context={"projectPath": "/p"})
    t = transition(build_project, m, Ack("WRITE_CODE", 1, False, {"filesCreated": ["x"]}))
    assert t.output == {"filesCreated": ["x"]}
    assert t.context == m.context


def test_run_tests_does_not_retry_a_failure(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS")  # retry_on: [timeout]
    t = transition(build_project, m, Ack("RUN_TESTS", 1, False, {}, "3 tests failed"))
    assert (t.to_state, t.failure, t.state_retries) == ("WRITE_CODE", FailureKind.FAILURE, 0)
    assert t.context["retryCount"] == 1  # its failure edge is a loop edge


def test_run_tests_retries_a_timeout(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS")
    t = transition(build_project, m, Timeout("RUN_TESTS", 1))
    assert (t.to_state, t.failure, t.state_retries, t.error) == (
        "RUN_TESTS",
        FailureKind.TIMEOUT,
        1,
        "timed out (retry 1 of 1)",
    )


def test_run_tests_does_not_retry_missing_output(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS")
    t = transition(build_project, m, Ack("RUN_TESTS", 1, True, {}))
    assert (t.to_state, t.failure) == ("WRITE_CODE", FailureKind.INVALID_OUTPUT)


def test_missing_required_output_fails_the_attempt(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "ANALYZE_ISSUE", context={"projectName": "p"})
    t = transition(build_project, m, Ack("ANALYZE_ISSUE", 1, True, {"summary": "?"}))
    assert (t.to_state, t.success, t.failure, t.state_retries) == (
        "ANALYZE_ISSUE",
        False,
        FailureKind.INVALID_OUTPUT,
        1,
    )
    assert t.error == "missing required output: needsSpec, complexity (retry 1 of 2)"
    assert t.output == {"summary": "?"}
    assert t.context == m.context


def test_missing_output_names_only_the_missing_keys(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "ANALYZE_ISSUE", retries=2)
    t = transition(build_project, m, Ack("ANALYZE_ISSUE", 1, True, {"needsSpec": True}))
    assert (t.to_state, t.failure, t.error) == (
        "FAILED",
        FailureKind.INVALID_OUTPUT,
        "missing required output: complexity",
    )


def test_timeout_with_retries_left_retries(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "DEPLOY_PROD", attempt=9)
    t = transition(build_project, m, Timeout("DEPLOY_PROD", 9))
    assert (t.to_state, t.attempt, t.state_retries, t.failure, t.output) == (
        "DEPLOY_PROD",
        10,
        1,
        FailureKind.TIMEOUT,
        None,
    )


def test_timeout_without_retries_left_takes_on_failure(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "DEPLOY_PROD", retries=2)
    t = transition(build_project, m, Timeout("DEPLOY_PROD", 1))
    assert (t.to_state, t.status, t.error, t.failure) == (
        "FAILED",
        MachineStatus.FAILED,
        "timed out",
        FailureKind.TIMEOUT,
    )


# -- loop edges -------------------------------------------------------------------------------


def test_initial_context_seeds_the_loop_counters(build_project: MachineDefinition) -> None:
    assert initial_context(build_project, {"projectName": "p"}) == {
        "projectName": "p",
        "retryCount": 0,
        "maxRetries": build_project.max_loops,
    }


def test_initial_context_keeps_the_callers_counters(build_project: MachineDefinition) -> None:
    given = {"retryCount": 1, "maxRetries": 9}
    assert initial_context(build_project, given) == given
    assert initial_context(build_project, {}) is not initial_context(build_project, {})


def test_failed_tests_loop_back_to_write_code(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS")
    t = transition(build_project, m, Ack("RUN_TESTS", 1, True, {"passed": False}))
    assert (t.to_state, t.success, t.status, t.error) == (
        "WRITE_CODE",
        True,
        MachineStatus.RUNNING,
        None,
    )
    assert t.context["retryCount"] == 1


def test_passing_tests_go_on_without_counting_a_loop(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS", context={"retryCount": 2})
    t = transition(build_project, m, Ack("RUN_TESTS", 1, True, {"passed": True}))
    assert (t.to_state, t.context["retryCount"]) == ("COMMIT_PUSH", 2)


def test_loop_up_to_max_retries_is_allowed(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS", context={"retryCount": 2})  # maxRetries 3
    t = transition(build_project, m, Ack("RUN_TESTS", 1, True, {"passed": False}))
    assert (t.to_state, t.context["retryCount"]) == ("WRITE_CODE", 3)


def test_loop_past_max_retries_goes_to_on_loop_exhausted(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS", context={"retryCount": 3})
    t = transition(build_project, m, Ack("RUN_TESTS", 1, True, {"passed": False}))
    assert (t.to_state, t.status, t.success) == ("FAILED", MachineStatus.FAILED, True)
    assert t.context["retryCount"] == 4
    assert t.error == "loop limit reached: 4 loops back to WRITE_CODE, maxRetries=3"


def test_failure_loop_past_max_retries_keeps_the_failure(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "VERIFY_STAGING", context={"retryCount": 3})
    t = transition(build_project, m, Ack("VERIFY_STAGING", 1, False, {}, "e2e failed"))
    assert (t.to_state, t.failure) == ("FAILED", FailureKind.FAILURE)
    assert t.error == "e2e failed; loop limit reached: 4 loops back to WRITE_CODE, maxRetries=3"


def test_callers_max_retries_bounds_the_loops(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "RUN_TESTS", context={"retryCount": 3, "maxRetries": 9})
    assert transition(build_project, m, Ack("RUN_TESTS", 1, False)).to_state == "WRITE_CODE"
    m = machine_in(build_project, "RUN_TESTS", context={"maxRetries": 0})
    assert transition(build_project, m, Ack("RUN_TESTS", 1, False)).to_state == "FAILED"


@pytest.mark.parametrize(
    "counters", [{"retryCount": 0}, {"maxRetries": 99}], ids=["reset-count", "raise-limit"]
)
def test_agent_output_cannot_reset_or_raise_the_loop_bound(
    build_project: MachineDefinition, counters: dict[str, Any]
) -> None:
    m = machine_in(build_project, "RUN_TESTS", context={"retryCount": 3})  # maxRetries 3
    t = transition(build_project, m, Ack("RUN_TESTS", 1, True, {"passed": False, **counters}))
    assert t.to_state == "FAILED"


@pytest.mark.parametrize(
    "counters", [{"retryCount": "x"}, {"maxRetries": None}], ids=["junk-count", "null-limit"]
)
def test_malformed_loop_counters_in_agent_output_do_not_crash_decide(
    build_project: MachineDefinition, counters: dict[str, Any]
) -> None:
    m = machine_in(build_project, "RUN_TESTS")
    decision = decide(build_project, m, Ack("RUN_TESTS", 1, True, {"passed": False, **counters}))
    assert isinstance(decision, Transition)


def test_research_pipeline_allows_max_loops_revisions(research: MachineDefinition) -> None:
    m = machine_in(research, "ANALYZING")
    visited = []
    for _ in range(research.max_loops + 1):
        m = after(m, transition(research, m, Ack("ANALYZING", m.attempt, True, {"taskState": {}})))
        reject = Ack("REVIEWING", m.attempt, True, {"taskState": {}, "approved": False})
        m = after(m, transition(research, m, reject))
        visited.append(m.current_state)
    assert visited == ["ANALYZING", "ANALYZING", "FAILED"]
    assert m.status is MachineStatus.FAILED


# -- terminals --------------------------------------------------------------------------------


def test_success_into_a_completed_terminal(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "DEPLOY_PROD")
    t = transition(build_project, m, Ack("DEPLOY_PROD", 1, True, {"prodUrl": "https://x"}))
    assert (t.to_state, t.status, t.enters_state) == ("COMPLETE", MachineStatus.COMPLETED, False)


def test_success_into_a_failed_terminal_fails_the_machine() -> None:
    t = transition(ROUTER, machine_in(ROUTER, "ROUTE"), Ack("ROUTE", 1, True, {}))
    assert (t.to_state, t.success, t.status, t.enters_state) == (
        "DEFAULT",
        True,
        MachineStatus.FAILED,
        False,
    )


def test_build_project_happy_path_with_one_test_loop(build_project: MachineDefinition) -> None:
    outputs: dict[str, dict[str, Any]] = {
        "ANALYZE_ISSUE": ANALYSIS,
        "WRITE_SPEC": {"specPath": "spec.md"},
        "CREATE_PROJECT": {"projectPath": "/p"},
        "WRITE_CODE": {"filesCreated": ["a.ts"]},
        "COMMIT_PUSH": {"commitHash": "abc"},
        "DEPLOY_STAGING": {"stagingUrl": "https://s"},
        "VERIFY_STAGING": {"verified": True},
        "DEPLOY_PROD": {"prodUrl": "https://p"},
    }
    passes = iter([False, True])
    m = machine_in(build_project, "ANALYZE_ISSUE")
    path = [m.current_state]
    while m.status is MachineStatus.RUNNING:
        state = m.current_state
        output = {"passed": next(passes)} if state == "RUN_TESTS" else outputs[state]
        m = after(m, transition(build_project, m, Ack(state, m.attempt, True, output)))
        path.append(m.current_state)
    assert path == [
        "ANALYZE_ISSUE",
        "WRITE_SPEC",
        "CREATE_PROJECT",
        "WRITE_CODE",
        "RUN_TESTS",
        "WRITE_CODE",
        "RUN_TESTS",
        "COMMIT_PUSH",
        "DEPLOY_STAGING",
        "VERIFY_STAGING",
        "DEPLOY_PROD",
        "COMPLETE",
    ]
    assert (m.status, m.attempt, m.context["retryCount"]) == (MachineStatus.COMPLETED, 12, 1)


# -- budgets ----------------------------------------------------------------------------------


def test_spending_past_the_budget_pauses_in_the_next_state(
    build_project: MachineDefinition,
) -> None:
    m = machine_in(build_project, "WRITE_SPEC")
    m = Machine(m.id, m.current_state, m.status, 1, 0, m.context, Usage(900), Budget(tokens=1000))
    output = {"specPath": "s.md", "tokensUsed": 200}
    t = transition(build_project, m, Ack("WRITE_SPEC", 1, True, output))
    assert (t.to_state, t.status, t.usage) == ("CREATE_PROJECT", MachineStatus.PAUSED, Usage(200))
    assert t.error == "budget exceeded: 1100 tokens used, budget 1000"
    assert not t.enters_state


@pytest.mark.parametrize(
    ("spent", "output"),
    [
        (Usage(2**53 - 1), {"tokensUsed": 1}),
        (Usage(2**63 - 1), {"tokensUsed": 2**63 - 1}),
        (Usage(0, 1.7e308), {"cost": 1.7e308}),
        (Usage(0, 1e12), {"cost": 0.5}),
        (Usage(), {"cost": 10**400}),
    ],
    ids=[
        "tokens-past-2**53",
        "tokens-past-bigint",
        "cost-to-infinity",
        "cost-past-1e12",
        "10**400",
    ],
)
def test_an_ack_whose_usage_would_take_the_totals_past_their_bounds_is_rejected(
    build_project: MachineDefinition, spent: Usage, output: dict[str, Any]
) -> None:
    m = machine_in(build_project, "WRITE_SPEC")
    m = Machine(m.id, m.current_state, m.status, 1, 0, m.context, spent)
    r = rejection(build_project, m, Ack("WRITE_SPEC", 1, True, {"specPath": "s.md", **output}))
    assert r.reason is RejectReason.INVALID_VALUE
    assert "would take the machine's totals to" in r.detail


def test_an_ack_reporting_nothing_moves_a_machine_whose_stored_totals_are_past_the_bounds(
    build_project: MachineDefinition,
) -> None:
    m = machine_in(build_project, "WRITE_SPEC")
    m = Machine(m.id, m.current_state, m.status, 1, 0, m.context, Usage(2**63 - 1, 1e300))
    t = transition(build_project, m, Ack("WRITE_SPEC", 1, True, {"specPath": "s.md"}))
    assert t.to_state == "CREATE_PROJECT"


# -- rejections -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "status", [MachineStatus.PAUSED, MachineStatus.CANCELLED, MachineStatus.FAILED]
)
def test_ack_for_a_machine_that_is_not_running(
    build_project: MachineDefinition, status: MachineStatus
) -> None:
    m = machine_in(build_project, "WRITE_CODE", status=status)
    r = rejection(build_project, m, Ack("WRITE_CODE", 1, True, {"filesCreated": []}))
    assert (r.reason, r.detail) == (RejectReason.NOT_RUNNING, f"the machine is {status.value}")


def test_ack_for_a_completed_machine(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "COMPLETE", attempt=12, status=MachineStatus.COMPLETED)
    r = rejection(build_project, m, Ack("COMPLETE", 12, True, {}))
    assert r.reason is RejectReason.NOT_RUNNING


def test_timeout_for_a_paused_machine(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_CODE", status=MachineStatus.PAUSED)
    assert rejection(build_project, m, Timeout("WRITE_CODE", 1)).reason is RejectReason.NOT_RUNNING


@pytest.mark.parametrize("event", [Ack("WRITE_CODE", 4, True), Timeout("WRITE_CODE", 4)])
def test_stale_attempt(build_project: MachineDefinition, event: Event) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=5)
    r = rejection(build_project, m, event)
    assert r.reason is RejectReason.STALE_ATTEMPT
    assert r.detail == "attempt 4 was already decided; the machine is at attempt 5"


def test_unknown_future_attempt(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=5)
    r = rejection(build_project, m, Ack("WRITE_CODE", 6, True, {"filesCreated": []}))
    assert r.reason is RejectReason.UNKNOWN_ATTEMPT
    assert r.detail.startswith("attempt 6 is ahead of the machine, which is at attempt 5: ")
    assert "rolled back" in r.detail


@pytest.mark.parametrize("event", [Ack("RUN_TESTS", 5, True, {"passed": True}), Timeout("X", 5)])
def test_wrong_state(build_project: MachineDefinition, event: Event) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=5)
    r = rejection(build_project, m, event)
    assert r.reason is RejectReason.WRONG_STATE
    assert f"{event.state!r} but the machine is in 'WRITE_CODE'" in r.detail


def test_the_same_ack_twice_is_applied_once(build_project: MachineDefinition) -> None:
    m = machine_in(build_project, "COMMIT_PUSH")
    ack = Ack("COMMIT_PUSH", 1, True, {"commitHash": "abc"})
    moved = after(m, transition(build_project, m, ack))
    assert rejection(build_project, moved, ack).reason is RejectReason.STALE_ATTEMPT


# -- hand-backs, dispatch failures, limits ---------------------------------------------------


def test_a_hand_back_sends_the_same_state_again_without_counting_a_retry(
    build_project: MachineDefinition,
) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=4, retries=1)
    t = transition(build_project, m, HandBack("WRITE_CODE", 4, "shutting down"))
    assert (t.to_state, t.status, t.attempt, t.state_retries) == (
        "WRITE_CODE",
        MachineStatus.RUNNING,
        5,
        1,
    )
    assert (t.success, t.failure, t.delay_seconds, t.handbacks) == (False, None, 0.0, 1)
    assert t.error == "handed back: shutting down"


def test_hand_backs_past_the_limit_count_as_a_failure(build_project: MachineDefinition) -> None:
    limits = Limits(max_handbacks=2)
    m = machine_in(build_project, "WRITE_CODE", attempt=4)
    for attempt in (4, 5):
        decision = decide(build_project, m, HandBack("WRITE_CODE", attempt), limits)
        assert isinstance(decision, Transition) and decision.failure is None
        m = after(m, decision)
    t = decide(build_project, m, HandBack("WRITE_CODE", 6), limits)
    assert isinstance(t, Transition)
    assert (t.failure, t.handbacks) == (FailureKind.FAILURE, 0)
    assert t.error is not None and "3 times in a row" in t.error


def test_any_other_outcome_starts_the_count_of_hand_backs_again(
    build_project: MachineDefinition,
) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=4)
    m = after(m, transition(build_project, m, HandBack("WRITE_CODE", 4)))
    t = transition(build_project, m, Ack("WRITE_CODE", 5, False, error="flaky"))
    assert t.handbacks == 0


def test_a_state_that_cannot_be_dispatched_fails_its_machine_where_it_is_without_retrying(
    build_project: MachineDefinition,
) -> None:
    m = machine_in(build_project, "WRITE_CODE", attempt=4)
    t = transition(build_project, m, DispatchFailed("WRITE_CODE", 4, "'topic' is undefined"))
    state = build_project.state("WRITE_CODE")
    assert state.max_retries > 0  # it would be retried if it were an agent's failure
    assert state.on_failure is not None and state.on_failure.target != "WRITE_CODE"
    assert (t.from_state, t.to_state, t.status) == ("WRITE_CODE", "WRITE_CODE", "failed")
    assert (t.success, t.failure, t.attempt) == (False, FailureKind.DISPATCH, 5)
    assert t.error == "not dispatched: 'topic' is undefined"


def test_a_state_that_cannot_be_dispatched_ignores_a_failure_edge_to_a_working_state() -> None:
    """CHECK_UPTIME's failure edge leads to GENERATE_REPORT, where an agent would work."""
    check = load_file(DEFINITIONS / "cto_infrastructure_check.yaml")
    m = machine_in(check, "CHECK_UPTIME")
    t = transition(check, m, DispatchFailed("CHECK_UPTIME", 1, "broken"))
    assert (t.to_state, t.status) == ("CHECK_UPTIME", "failed")


def test_an_output_that_would_grow_the_context_past_its_limit_is_invalid(
    build_project: MachineDefinition,
) -> None:
    m = machine_in(build_project, "ANALYZE_ISSUE", context={"notes": "n" * 500})
    big = {**ANALYSIS, "blob": "b" * 600}
    decision = decide(build_project, m, Ack("ANALYZE_ISSUE", 1, True, big), Limits(1_000))
    assert isinstance(decision, Transition)
    assert decision.failure is FailureKind.INVALID_OUTPUT
    assert decision.error is not None and "over the limit of 1000" in decision.error
    small = decide(build_project, m, Ack("ANALYZE_ISSUE", 1, True, ANALYSIS), Limits(1_000))
    assert isinstance(small, Transition) and small.success


def test_a_heartbeat_never_moves_a_deadline_past_the_attempts_longest_duration() -> None:
    d = load_text("""
type: long
agent_type: x
initial_state: A
states:
  - {name: A, timeout: 60, heartbeat_timeout: 30, max_duration: 100, on_success: B,
     on_failure: B}
  - {name: B, terminal: completed}
""")
    state = d.state("A")
    entered = datetime(2026, 1, 1, tzinfo=UTC)
    default = timedelta(hours=1)
    assert state.heartbeat_deadline(entered, entered + timedelta(seconds=10), default) == (
        entered + timedelta(seconds=40)
    )
    assert state.heartbeat_deadline(entered, entered + timedelta(seconds=90), default) == (
        entered + timedelta(seconds=100)
    )


def test_a_dispatch_failure_cannot_be_retried_by_definition() -> None:
    with pytest.raises(DefinitionError, match="not retried"):
        load_text("""
type: bad
agent_type: x
initial_state: A
states:
  - {name: A, retry_on: [dispatch], on_success: B, on_failure: B}
  - {name: B, terminal: completed}
""")
