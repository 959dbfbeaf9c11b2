"""Approval gates, pure: how decisions are counted, what a form accepts, what a verdict or a
deadline decides, and what the validator refuses in an approval state."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from fsm_celery.core import gate
from fsm_celery.core.attempt_events import Ack, GateDecided, Timeout
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.gate import Approval, Choice, Verdict, Vote
from fsm_celery.core.loader import load_file, load_text
from fsm_celery.core.transition import (
    FailureKind,
    MachineStatus,
    Rejected,
    RejectReason,
    Transition,
    decide,
)
from fsm_celery.exceptions import DefinitionError
from tests.unit.conftest import machine_in

GATE = Path(__file__).parents[1] / "fixtures" / "definitions" / "test_gate.yaml"


@pytest.fixture(scope="module")
def gated() -> MachineDefinition:
    return load_file(GATE)


def _form() -> Approval:
    schema = {
        "type": "object",
        "properties": {"target": {"enum": ["staging", "production"]}},
        "required": ["target"],
    }
    return Approval.model_validate({"approvers": ["release"], "schema": schema})


@pytest.mark.parametrize(
    ("quorum", "rejections", "members", "approved", "rejected", "verdict"),
    [
        (1, 1, 3, 0, 0, Verdict.PENDING),
        (1, 1, 3, 1, 0, Verdict.APPROVED),
        (2, 1, 3, 1, 0, Verdict.PENDING),
        (2, 1, 3, 2, 0, Verdict.APPROVED),
        (2, 1, 3, 1, 1, Verdict.REJECTED),  # one rejection stops it, by default
        (2, 2, 3, 1, 1, Verdict.PENDING),
        (2, 2, 3, 2, 1, Verdict.APPROVED),
        ("all", 1, 3, 2, 0, Verdict.PENDING),
        ("all", 1, 3, 3, 0, Verdict.APPROVED),
        ("all", 1, 0, 1, 0, Verdict.APPROVED),  # nobody in the groups: an admin's one decides
    ],
)
def test_count(
    quorum: int | str, rejections: int, members: int, approved: int, rejected: int, verdict: Verdict
) -> None:
    approval = Approval.model_validate(
        {"approvers": ["release"], "quorum": quorum, "rejections": rejections}
    )
    assert gate.count(approval, members, approved, rejected).verdict is verdict


def test_members_are_the_union_of_the_groups() -> None:
    approval = Approval(approvers=("release", "ops"))
    groups = {"release": {"alice", "carol"}, "ops": {"carol", "dave"}, "other": {"eve"}}
    assert gate.members_of(groups, approval) == {"alice", "carol", "dave"}


def test_an_approval_fills_in_the_form_a_rejection_need_not() -> None:
    approval = _form()
    assert gate.fields_problem(approval, Vote("a", Choice.APPROVE, {"target": "staging"})) is None
    missing = gate.fields_problem(approval, Vote("a", Choice.APPROVE, {}))
    assert missing is not None and "target" in missing
    assert gate.fields_problem(approval, Vote("a", Choice.REJECT, {})) is None
    wrong = gate.fields_problem(approval, Vote("a", Choice.REJECT, {"target": "moon"}))
    assert wrong is not None and "moon" in wrong  # what a rejection says is still checked
    formless = Approval(approvers=("release",))
    assert gate.fields_problem(formless, Vote("a", Choice.APPROVE, {"x": 1})) is not None


def _decided(definition: MachineDefinition, event: object) -> Transition:
    found = decide(definition, machine_in(definition, "REVIEW", attempt=3), event)  # type: ignore[arg-type]
    assert isinstance(found, Transition), found
    return found


def test_only_the_fields_a_form_declares_reach_the_context() -> None:
    open_form = Approval(
        approvers=("release",),
        schema={"type": "object", "properties": {"target": {"type": "string"}}},
    )
    sent = {"target": "staging", "retryCount": 99, "approval": "forged"}
    assert gate.declared(open_form, sent) == {"target": "staging"}
    assert gate.declared(Approval(approvers=("release",)), sent) == {}  # no form: nothing
    no_properties = Approval(approvers=("release",), schema={"type": "object"})
    assert gate.declared(no_properties, sent) == {}


def test_an_override_decides_the_gate_outright_and_says_so() -> None:
    assert gate.overridden(Choice.APPROVE) is Verdict.APPROVED
    assert gate.overridden(Choice.REJECT) is Verdict.REJECTED
    votes = [("alice", "approve", "", False), ("ops", "reject", "no", True)]
    assert gate.summary(Verdict.REJECTED, votes)["approval"]["decisions"] == [
        {"actor": "alice", "decision": "approve", "comment": ""},
        {"actor": "ops", "decision": "reject", "comment": "no", "override": True},
    ]


def test_an_approval_takes_the_first_edge_whose_guard_the_form_meets(
    gated: MachineDefinition,
) -> None:
    prod = _decided(gated, GateDecided("REVIEW", 3, True, {"target": "production"}))
    assert (prod.to_state, prod.success, prod.attempt) == ("SHIP_PROD", True, 4)
    assert prod.context["target"] == "production" and prod.agent_type == "tester"
    staging = _decided(gated, GateDecided("REVIEW", 3, True, {"target": "staging"}))
    assert staging.to_state == "SHIP"


def test_a_rejection_takes_its_loop_edge(gated: MachineDefinition) -> None:
    back = _decided(gated, GateDecided("REVIEW", 3, False, gate.summary(Verdict.REJECTED, [])))
    assert (back.to_state, back.success, back.error) == ("BUILD", False, "rejected at REVIEW")
    assert back.failure is FailureKind.FAILURE  # a rejection is the state's failure
    assert back.context["retryCount"] == 1


def test_the_deadline_escalates_approves_or_rejects(gated: MachineDefinition) -> None:
    escalated = _decided(gated, Timeout("REVIEW", 3))
    assert (escalated.to_state, escalated.failure) == ("ESCALATE", FailureKind.TIMEOUT)
    assert "escalated to ESCALATE" in (escalated.error or "")
    at_ops = machine_in(gated, "ESCALATE", attempt=4)
    rejected = decide(gated, at_ops, Timeout("ESCALATE", 4))
    assert isinstance(rejected, Transition)
    assert (rejected.to_state, rejected.status, rejected.success) == (
        "FAILED",
        MachineStatus.FAILED,
        False,
    )
    assert rejected.context["approval"]["timedOut"] is True
    assert rejected.failure is FailureKind.TIMEOUT
    text = GATE.read_text().replace("approvers: [ops]", "approvers: [ops]\n    on_timeout: approve")
    approving = load_text(text)
    approved = decide(approving, at_ops, Timeout("ESCALATE", 4))
    assert isinstance(approved, Transition)
    assert (approved.to_state, approved.success) == ("SHIP", True)
    assert "approved (its on_timeout)" in (approved.error or "")


def test_no_agent_moves_an_approval_state(gated: MachineDefinition) -> None:
    machine = machine_in(gated, "REVIEW", attempt=3)
    refused = decide(gated, machine, Ack("REVIEW", 3, True, {"target": "production"}))
    assert isinstance(refused, Rejected) and refused.reason is RejectReason.WRONG_STATE
    at_build = machine_in(gated, "BUILD", attempt=1)
    not_a_gate = decide(gated, at_build, GateDecided("BUILD", 1, True, {}))
    assert isinstance(not_a_gate, Rejected) and "neither people nor an event" in not_a_gate.detail
    stale = decide(gated, machine, GateDecided("REVIEW", 2, True, {"target": "staging"}))
    assert isinstance(stale, Rejected) and stale.reason is RejectReason.STALE_ATTEMPT


def test_a_guard_the_decision_breaks_refuses_the_decision(gated: MachineDefinition) -> None:
    text = GATE.read_text().replace("output.target == 'production'", "output.target > `1`")
    broken = load_text(text)
    refused = decide(
        broken,
        machine_in(broken, "REVIEW", attempt=3),
        GateDecided("REVIEW", 3, True, {"target": "x"}),
    )
    assert isinstance(refused, Rejected) and "failed on the decision" in refused.detail


GATE_STATE = """
type: t
agent_type: a
initial_state: ASK
states:
  - name: ASK
{extra}
  - name: DONE
    terminal: completed
  - name: STOP
    terminal: failed
"""


def _problems(extra: str) -> list[str]:
    try:
        load_text(GATE_STATE.format(extra=extra))
    except DefinitionError as exc:
        return [p.message for p in exc.problems]
    return []


def test_an_approval_state_waits_a_day_unless_told() -> None:
    d = load_text(
        GATE_STATE.format(
            extra="    approval: {approvers: [release]}\n    on_approve: DONE\n    on_reject: STOP"
        )
    )
    assert d.state("ASK").timeout == timedelta(days=1) == gate.DEFAULT_TIMEOUT
    assert d.to_json()["states"][0]["approval"] == {"approvers": ["release"]}


@pytest.mark.parametrize(
    ("extra", "problem"),
    [
        ("    approval: {approvers: [r]}\n    on_approve: DONE", "needs on_reject"),
        (
            "    approval: {approvers: [r]}\n    prompt: hi\n    on_approve: DONE\n"
            "    on_reject: STOP",
            "has no prompt",
        ),
        (
            "    approval: {approvers: [r]}\n    on_success: DONE\n    on_approve: DONE\n"
            "    on_reject: STOP",
            "has no on_success",
        ),
        (
            "    approval: {approvers: [r], quorum: 0}\n    on_approve: DONE\n    on_reject: STOP",
            "quorum must be at least 1",
        ),
        (
            "    approval: {approvers: [r], schema: {type: array}}\n    on_approve: DONE\n"
            "    on_reject: STOP",
            "a decision is a JSON object",
        ),
        (
            "    approval: {approvers: [r]}\n    on_timeout: NOWHERE\n    on_approve: DONE\n"
            "    on_reject: STOP",
            "unknown target state 'NOWHERE'",
        ),
        (
            "    approval: {approvers: [r]}\n    on_approve: [{target: DONE, when: 'output.x'}]\n"
            "    on_reject: STOP",
            "last on_approve edge must have no guard",
        ),
        (
            "    on_success: DONE\n    on_failure: STOP\n    on_approve: DONE",
            "applies to an approval",
        ),
    ],
)
def test_what_an_approval_state_may_not_be(extra: str, problem: str) -> None:
    assert any(problem in found for found in _problems(extra)), _problems(extra)
