"""Waiting on outside events, pure: what a wait decides, what the validator refuses in a waiting
state, and which GitHub deliveries are events for which machines."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm_celery.core import github
from fsm_celery.core.attempt_events import Ack, EventArrived, Timeout
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.graph import WAIT, graph
from fsm_celery.core.loader import load_file, load_text
from fsm_celery.core.transition import FailureKind, Rejected, RejectReason, Transition, decide
from fsm_celery.exceptions import DefinitionError
from tests.unit.conftest import machine_in

WAIT_YAML = Path(__file__).parents[1] / "fixtures" / "definitions" / "test_wait.yaml"


@pytest.fixture(scope="module")
def waits() -> MachineDefinition:
    return load_file(WAIT_YAML)


def test_the_payload_is_the_output_and_guards_read_it(waits: MachineDefinition) -> None:
    machine = machine_in(waits, "WAIT_MERGE", attempt=2)
    merged = decide(waits, machine, EventArrived("WAIT_MERGE", 2, "pr_merged", {"merged": True}))
    assert isinstance(merged, Transition)
    assert (merged.to_state, merged.success, merged.context["merged"]) == ("DEPLOY", True, True)
    closed = decide(waits, machine, EventArrived("WAIT_MERGE", 2, "pr_merged", {"merged": False}))
    assert isinstance(closed, Transition) and closed.to_state == "BUILD"


def test_no_event_in_time_takes_on_timeout_as_a_timeout_failure(waits: MachineDefinition) -> None:
    timed_out = decide(waits, machine_in(waits, "WAIT_MERGE", attempt=2), Timeout("WAIT_MERGE", 2))
    assert isinstance(timed_out, Transition)
    assert (timed_out.to_state, timed_out.failure) == ("FAILED", FailureKind.TIMEOUT)


def test_only_its_event_moves_a_waiting_state(waits: MachineDefinition) -> None:
    machine = machine_in(waits, "WAIT_MERGE", attempt=2)
    other = decide(waits, machine, EventArrived("WAIT_MERGE", 2, "deployed", {}))
    assert isinstance(other, Rejected) and "not deployed" in other.detail
    acked = decide(waits, machine, Ack("WAIT_MERGE", 2, True, {"merged": True}))
    assert isinstance(acked, Rejected) and acked.reason is RejectReason.WRONG_STATE
    at_build = decide(waits, machine_in(waits, "BUILD"), EventArrived("BUILD", 1, "pr_merged", {}))
    assert isinstance(at_build, Rejected) and "neither people nor an event" in at_build.detail


def test_a_waiting_state_is_drawn_with_its_event(waits: MachineDefinition) -> None:
    drawn = graph(waits)
    [node] = [n for n in drawn.nodes if n.id == "WAIT_MERGE"]
    assert (node.kind, node.detail) == (WAIT, "waits for pr_merged")
    labels = {(link.target, link.label) for link in drawn.links if link.source == "WAIT_MERGE"}
    assert labels == {
        ("DEPLOY", "pr_merged: output.merged"),
        ("BUILD", "pr_merged (loop)"),
        ("FAILED", "no event: timeout"),
        ("FAILED", "loops spent"),
    }


STATE = """
type: t
agent_type: a
initial_state: WAIT
states:
  - name: WAIT
{extra}
  - name: DONE
    terminal: completed
  - name: STOP
    terminal: failed
"""


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("    wait: {event: ci}\n    on_timeout: STOP", "needs on_event"),
        ("    wait: {event: ci}\n    on_event: DONE", "needs on_timeout"),
        ("    wait: {event: ci}\n    on_event: DONE\n    on_timeout: reject", "needs on_timeout"),
        (
            "    wait: {event: ci}\n    prompt: hi\n    on_event: DONE\n    on_timeout: STOP",
            "a waiting state has no prompt",
        ),
        (
            "    wait: {event: ci, schema: {type: string}}\n    on_event: DONE\n"
            "    on_timeout: STOP",
            "a payload is a JSON object",
        ),
        (
            "    wait: {event: ci}\n    approval: {approvers: [r]}\n    on_event: DONE\n"
            "    on_timeout: STOP",
            "not both",
        ),
        ("    on_success: DONE\n    on_failure: STOP\n    on_event: DONE", "applies to a waiting"),
    ],
)
def test_what_a_waiting_state_may_not_be(extra: str, problem: str) -> None:
    with pytest.raises(DefinitionError) as refused:
        load_text(STATE.format(extra=extra))
    assert any(problem in p.message for p in refused.value.problems), refused.value


def test_a_wait_with_a_bad_event_name_is_refused() -> None:
    with pytest.raises(DefinitionError, match="event"):
        load_text(
            STATE.format(
                extra="    wait: {event: CI Done}\n    on_event: DONE\n    on_timeout: STOP"
            )
        )


def _repository() -> dict[str, str]:
    return {"full_name": "octo-org/hello-world", "name": "hello-world"}


def _pull(body: str, merged: bool = True, action: str = "closed") -> dict[str, object]:
    return {
        "action": action,
        "pull_request": {
            "number": 9,
            "title": "Fix the spelling",
            "body": body,
            "merged": merged,
            "merge_commit_sha": "abc",
            "head": {"ref": "fix"},
            "base": {"ref": "main"},
            "merged_by": {"login": "monalisa"},
        },
        "repository": _repository(),
    }


def test_a_merged_pull_request_is_pr_merged_for_the_issues_it_closes() -> None:
    found = github.outside_event("pull_request", _pull("Fixes #12, closes #7 and resolves: #12"))
    assert isinstance(found, github.Outside)
    assert (found.name, found.issues, found.branch) == ("pr_merged", (12, 7), None)
    assert found.payload["merged"] is True and found.payload["mergedBy"] == "monalisa"


@pytest.mark.parametrize(
    ("event", "payload", "why"),
    [
        ("pull_request", _pull("Fixes #12", merged=False), "without being merged"),
        ("pull_request", _pull("Fixes #12", action="opened"), "only a pull request closed"),
        ("pull_request", _pull("mentions #12 only"), "closes no issue"),
        ("push", _pull("Fixes #12"), "carries no event"),
        (
            "check_suite",
            {"action": "requested", "check_suite": {}, "repository": _repository()},
            "only a check_suite completed",
        ),
        (
            "check_suite",
            {
                "action": "completed",
                "check_suite": {"head_branch": None},
                "repository": _repository(),
            },
            "no head branch",
        ),
        ("workflow_run", [], "not a JSON object"),
    ],
)
def test_what_is_no_event(event: str, payload: object, why: str) -> None:
    found = github.outside_event(event, payload)
    assert isinstance(found, github.Ignored) and why in found.reason


def test_finished_checks_are_checks_completed_for_their_branch() -> None:
    run = {
        "head_branch": "feature-x",
        "head_sha": "e1",
        "conclusion": "failure",
        "name": "CI",
        "head_repository": _repository(),  # the run's own repository: no fork
    }
    found = github.outside_event(
        "workflow_run", {"action": "completed", "workflow_run": run, "repository": _repository()}
    )
    assert isinstance(found, github.Outside)
    assert (found.name, found.branch, found.payload["conclusion"], found.payload["check"]) == (
        "checks_completed",
        "feature-x",
        "failure",
        "CI",
    )
