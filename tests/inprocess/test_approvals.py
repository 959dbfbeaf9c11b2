"""Approval gates against real PostgreSQL and Redis: people's decisions counted once, in the
transaction that records them; deadlines that approve, reject or escalate; a gate kept across a
pause (tests/fixtures/definitions/test_gate.yaml: two of `release` approve, one rejects)."""

from __future__ import annotations

import json
import threading
from typing import Any
from uuid import UUID

import pytest

from fsm_celery.core.admin import Action, Command
from fsm_celery.core.gate import Choice, Vote
from fsm_celery.engine import Inbound
from fsm_celery.engine.approvals import ADMIN, Authority, Decided
from fsm_celery.exceptions import GateClosed, InvalidDecision, NotAnApprover
from fsm_celery.store import gates as gate_store
from tests.inprocess.conftest import Fsm, ack
from tests.support import ROOT

RELEASE = Authority(admin=False, groups=frozenset({"release"}))
OPS = Authority(admin=False, groups=frozenset({"ops"}))


def _at_review(fsm: Fsm) -> UUID:
    mid = fsm.start("test_gate")
    fsm.receive(ack(fsm.agent("tester").task()))
    assert fsm.machine(mid).current_state == "REVIEW"
    return mid


def _sent(fsm: Fsm) -> list[str]:
    """The states whose tasks were sent to the test's agents, in order."""
    return [task["state"] for task in fsm.agent("tester").tasks()]


def _ack_last(fsm: Fsm) -> None:
    fsm.receive(ack(fsm.agent("tester").tasks()[-1]))


def _decide(
    fsm: Fsm,
    mid: UUID,
    actor: str,
    choice: str = "approve",
    authority: Authority = RELEASE,
    **fields: Any,
) -> Decided:
    vote = Vote(actor, Choice(choice), fields, comment=f"{actor} says {choice}", via="test")
    return fsm.engine.approvals.decide(mid, vote, authority)


def _gates(fsm: Fsm, mid: UUID) -> list[Any]:
    with fsm.engine.db.connect() as conn:
        return list(gate_store.machine_gates_txn(conn, mid))


def test_entering_a_gate_sends_no_task_and_waits_for_people_until_its_deadline(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    assert _sent(fsm) == ["BUILD"]  # people decide REVIEW: nothing went to an agent
    [gate] = _gates(fsm, mid)
    assert (gate.state, gate.verdict, gate.needed, gate.closed_at) == ("REVIEW", "pending", 2, None)
    machine = fsm.machine(mid)
    assert machine.deadline_at is not None
    assert abs((machine.deadline_at - fsm.clock.now).total_seconds() - 3600) < 1
    with fsm.engine.db.connect() as conn:
        [pending] = gate_store.pending_txn(conn, 10)
    assert (pending.machine_id, pending.type, pending.status) == (mid, "test_gate", "running")


def test_a_quorum_of_two_moves_the_machine_once_and_guards_read_the_form(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    first = _decide(fsm, mid, "alice", target="production")
    assert (first.recorded, first.verdict, first.approvals, first.needed) == (
        True,
        "pending",
        1,
        2,
    )
    again = _decide(fsm, mid, "alice", "reject")  # a second decision by the same person
    assert (again.recorded, again.decision, again.approvals, again.rejections) == (
        False,
        "approve",
        1,
        0,
    )
    assert fsm.machine(mid).current_state == "REVIEW"
    closing = _decide(fsm, mid, "bob", target="production")
    assert (closing.verdict, closing.moved_to) == ("approved", "SHIP_PROD")
    machine = fsm.machine(mid)
    assert machine.current_state == "SHIP_PROD" and machine.context["target"] == "production"
    decisions = machine.context["approval"]["decisions"]
    assert [(d["actor"], d["decision"]) for d in decisions] == [
        ("alice", "approve"),
        ("bob", "approve"),
    ]
    assert _sent(fsm) == ["BUILD", "SHIP_PROD"]
    last = fsm.history(mid)[-1]
    assert (last.event, last.actor, last.from_state, last.to_state) == (
        "approval",
        "bob",
        "REVIEW",
        "SHIP_PROD",
    )
    [gate] = _gates(fsm, mid)
    assert (gate.verdict, gate.approvals) == ("approved", 2) and gate.closed_at is not None
    with pytest.raises(GateClosed, match="SHIP_PROD, which no person decides"):
        _decide(fsm, mid, "carol", target="staging")  # too late: the gate closed


def test_one_rejection_sends_the_work_back_and_a_new_visit_opens_a_new_gate(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    _decide(fsm, mid, "alice", target="staging")
    rejected = _decide(fsm, mid, "carol", "reject")  # a rejection fills in no required field
    assert (rejected.verdict, rejected.moved_to) == ("rejected", "BUILD")
    last = fsm.history(mid)[-1]  # docs/approvals.md: an approval row with success false
    assert (last.event, last.success, last.error_message) == (
        "approval",
        False,
        "rejected at REVIEW",
    )
    machine = fsm.machine(mid)
    assert machine.context["retryCount"] == 1  # the loop edge counted
    _ack_last(fsm)
    second = _gates(fsm, mid)[-1]
    assert (second.verdict, second.approvals) == ("pending", 0)
    assert _decide(fsm, mid, "alice", target="staging").recorded  # her decision is the gate's


def test_who_may_decide_and_what_they_must_fill_in(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    with pytest.raises(NotAnApprover, match="dave may not decide at REVIEW"):
        _decide(fsm, mid, "dave", authority=OPS, target="staging")
    with pytest.raises(InvalidDecision, match="target"):
        _decide(fsm, mid, "alice")  # an approval must say where to deploy
    with pytest.raises(InvalidDecision, match="'moon' is not one of"):
        _decide(fsm, mid, "alice", target="moon")
    with pytest.raises(InvalidDecision, match="Additional properties"):
        _decide(fsm, mid, "alice", target="staging", extra=1)
    with pytest.raises(InvalidDecision, match="comment is 2001 characters"):
        vote = Vote("alice", Choice.APPROVE, {"target": "staging"}, "x" * 2001)
        fsm.engine.approvals.decide(mid, vote, RELEASE)
    assert _gates(fsm, mid)[0].approvals == 0  # nothing refused was counted
    admin = _decide(fsm, mid, "root", authority=ADMIN, target="staging")  # an admin may
    assert admin.recorded and admin.override and admin.approvals == 0  # as an override


def test_a_decision_for_an_earlier_visit_is_refused(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    seen = fsm.machine(mid).attempt
    _decide(fsm, mid, "alice", "reject")
    _ack_last(fsm)
    assert fsm.machine(mid).current_state == "REVIEW"
    vote = Vote("bob", Choice.APPROVE, {"target": "staging"})
    with pytest.raises(GateClosed, match=f"attempt {seen}"):
        fsm.engine.approvals.decide(mid, vote, RELEASE, attempt=seen)


def test_the_deadline_escalates_then_rejects(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    fsm.clock.advance(3601)
    fsm.scan()
    machine = fsm.machine(mid)
    assert (machine.current_state, machine.status) == ("ESCALATE", "running")
    first, second = _gates(fsm, mid)
    assert (first.verdict, second.state, second.verdict) == ("timed_out", "ESCALATE", "pending")
    timeout = fsm.history(mid)[-1]
    assert timeout.event == "timeout" and "escalated to ESCALATE" in (timeout.error_message or "")
    with pytest.raises(NotAnApprover):
        _decide(fsm, mid, "alice")  # release is not ops
    fsm.clock.advance(601)
    fsm.scan()
    machine = fsm.machine(mid)
    assert (machine.current_state, machine.status) == ("FAILED", "failed")
    assert machine.context["approval"] == {"verdict": "rejected", "decisions": [], "timedOut": True}
    assert _sent(fsm) == ["BUILD"]  # no agent was sent anything for either gate


def test_a_paused_gate_refuses_decisions_and_keeps_them_when_resumed(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    _decide(fsm, mid, "alice", target="staging")
    fsm.enter_all(fsm.engine.admin.command(mid, Command(Action.PAUSE, "ops")))
    with pytest.raises(GateClosed, match="paused"):
        _decide(fsm, mid, "bob", target="staging")
    fsm.enter_all(fsm.engine.admin.command(mid, Command(Action.RESUME, "ops")))
    [gate] = _gates(fsm, mid)  # the same gate, at the machine's new attempt
    assert gate.attempt == fsm.machine(mid).attempt and gate.approvals == 1
    assert _decide(fsm, mid, "bob", target="staging").moved_to == "SHIP"


def test_a_forced_machine_leaves_its_gate_and_a_later_visit_opens_another(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    _decide(fsm, mid, "alice", target="staging")
    fsm.enter_all(fsm.engine.admin.command(mid, Command(Action.FORCE, "ops", target="BUILD")))
    with fsm.engine.db.connect() as conn:
        assert gate_store.pending_txn(conn, 10) == []  # left: no longer waiting for anyone
    _ack_last(fsm)
    first, second = _gates(fsm, mid)
    assert (first.verdict, second.verdict, second.approvals) == ("left", "pending", 0)


def _decisions(fsm: Fsm, mid: UUID) -> list[Any]:
    with fsm.engine.db.connect() as conn:
        return list(gate_store.machine_decisions_txn(conn, mid))


def test_one_admin_credential_cannot_make_a_quorum_of_two_it_overrides(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    _decide(fsm, mid, "alice", target="staging")  # the real alice: one vote of two
    overridden = _decide(fsm, mid, "bob", "reject", authority=ADMIN)  # an admin naming bob
    assert (overridden.override, overridden.verdict, overridden.moved_to) == (
        True,
        "rejected",
        "BUILD",
    )
    assert (overridden.approvals, overridden.rejections) == (1, 0)  # counted as nobody's vote
    made = _decisions(fsm, mid)
    assert [(d.actor, d.decision, d.override) for d in made] == [
        ("alice", "approve", False),
        ("bob", "reject", True),
    ]
    [gate] = _gates(fsm, mid)
    assert (gate.verdict, gate.approvals, gate.rejections) == ("rejected", 1, 0)
    last = fsm.history(mid)[-1]
    assert (last.event, last.actor, last.reason) == (
        "approval",
        "bob",
        "override by bob: bob says reject",
    )
    decisions = fsm.machine(mid).context["approval"]["decisions"]
    assert decisions[-1] == {
        "actor": "bob",
        "decision": "reject",
        "comment": "bob says reject",
        "override": True,
    }


def test_admins_naming_two_people_do_not_approve_a_gate_as_two_votes(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    first = _decide(fsm, mid, "alice", authority=ADMIN, target="staging")
    assert (first.override, first.verdict, first.approvals) == (True, "approved", 0)
    with pytest.raises(GateClosed):  # the gate was decided outright: no vote is left to cast
        _decide(fsm, mid, "bob", authority=ADMIN, target="staging")
    assert [(d.actor, d.override) for d in _decisions(fsm, mid)] == [("alice", True)]


def test_a_form_merges_only_the_fields_it_declares_into_the_context(fsm: Fsm) -> None:
    mid = fsm.start("test_gate_fast")
    fsm.receive(ack(fsm.agent("tester").task()))
    for who in ("alice", "bob"):  # REVIEW's form declares target, and allows more
        _decide(fsm, mid, who, target="staging", retryCount=99, approval="forged", x=1)
    context = fsm.machine(mid).context
    assert context["target"] == "staging" and "x" not in context
    assert context.get("retryCount", 0) != 99 and context["approval"]["verdict"] == "approved"


def test_a_person_repeating_the_decision_that_closed_the_gate_gets_it_back(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    _decide(fsm, mid, "alice", target="staging")
    seen = fsm.machine(mid).attempt
    closing = _decide(fsm, mid, "bob", target="staging")
    assert closing.moved_to == "SHIP"
    steps = len(fsm.history(mid))
    vote = Vote("bob", Choice.APPROVE, {"target": "staging"})
    again = fsm.engine.approvals.decide(mid, vote, RELEASE, attempt=seen)  # the reply was lost
    assert (again.recorded, again.decision, again.verdict, again.state, again.attempt) == (
        False,
        "approve",
        "approved",
        "REVIEW",
        seen,
    )
    assert len(fsm.history(mid)) == steps and len(_decisions(fsm, mid)) == 2  # nothing written
    with pytest.raises(GateClosed):  # another person, or another choice, is still too late
        _decide(fsm, mid, "carol", target="staging")
    with pytest.raises(GateClosed):
        _decide(fsm, mid, "bob", "reject")
    with pytest.raises(GateClosed):
        _decide(fsm, mid, "alice", target="staging")  # hers did not close it


def test_a_cancelled_machine_leaves_its_gate_in_the_same_transaction(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    _decide(fsm, mid, "alice", target="staging")
    fsm.enter_all(fsm.engine.admin.command(mid, Command(Action.CANCEL, "ops")))
    [gate] = _gates(fsm, mid)
    assert gate.verdict == "left" and gate.closed_at == fsm.clock.now


def test_a_rewound_machine_leaves_its_gate_in_the_same_transaction(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    fsm.engine.rewind.rewind(mid, 0, "ops", "build again")  # back to BUILD (not entered)
    [gate] = _gates(fsm, mid)
    assert gate.verdict == "left" and gate.closed_at == fsm.clock.now


def test_the_docs_script_gets_a_client_from_the_environment_and_overrides(
    fsm: Fsm, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fsm_celery.api import default_client
    from fsm_celery.config import get_settings

    text = (ROOT / "docs" / "approvals.md").read_text()
    script = text.split("## From a script", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    mid = _at_review(fsm)
    settings = fsm.settings
    for name in ("database_url", "redis_url", "task_token_secret", "channel_prefix", "queue"):
        monkeypatch.setenv(f"FSM_{name.upper()}", str(getattr(settings, name)))
    monkeypatch.setenv("MACHINE_ID", str(mid))
    get_settings.cache_clear()
    default_client.cache_clear()
    try:
        exec(compile(script, "docs/approvals.md", "exec"), {})
    finally:
        get_settings.cache_clear()
        default_client.cache_clear()
    printed = capsys.readouterr().out.splitlines()
    gate = fsm.machine(mid).attempt - 1  # the gate's attempt: REVIEW's
    assert printed == [f"{mid} REVIEW {gate} 0 2", "approved True SHIP"]
    made = _decisions(fsm, mid)
    assert [(d.actor, d.via, d.override) for d in made] == [("release-bot", "client", True)]


def test_a_machine_forced_from_its_gate_leaves_it_at_once(fsm: Fsm) -> None:
    mid = _at_review(fsm)
    fsm.engine.admin.command(mid, Command(Action.FORCE, "ops", target="SHIP"))  # not entered
    [gate] = _gates(fsm, mid)
    assert gate.verdict == "left" and gate.closed_at == fsm.clock.now


def _at_once(fsm: Fsm, mid: UUID, people: tuple[str, ...]) -> dict[str, Decided | Exception]:
    """Each person approves in a thread of their own, all released together; what each got."""
    start = threading.Barrier(len(people))
    outcomes: dict[str, Decided | Exception] = {}

    def decide(person: str) -> None:
        start.wait()
        try:
            outcomes[person] = _decide(fsm, mid, person, target="staging")
        except Exception as exc:  # GateClosed for the late one; anything else, shown
            outcomes[person] = exc

    threads = [threading.Thread(target=decide, args=(person,)) for person in people]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    return outcomes


def test_three_approvers_deciding_at_once_from_threads_make_one_quorum_and_one_move(
    fsm: Fsm,
) -> None:
    """A quorum of two, three approvers each in a thread of their own, released together, a
    round after another: each transaction locks the machine, then counts what committed before
    it, so exactly one of them closes the gate and the third finds it closed."""
    tester = fsm.agent("tester")
    for _ in range(10):
        mid = fsm.start("test_gate")
        [build] = [t for t in tester.tasks() if t["state"] == "BUILD"]
        fsm.receive(ack(build))
        assert fsm.machine(mid).current_state == "REVIEW"
        outcomes = _at_once(fsm, mid, ("alice", "bob", "carol"))
        story = (outcomes, [(r.event, r.to_state, r.actor) for r in fsm.history(mid)])
        [gate] = _gates(fsm, mid)
        assert (gate.verdict, gate.approvals) == ("approved", 2), story
        moved = [o for o in outcomes.values() if isinstance(o, Decided) and o.moved_to]
        assert [o.moved_to for o in moved] == ["SHIP"], story
        closed = [o for o in outcomes.values() if isinstance(o, GateClosed)]
        assert len(closed) == 1, story
        assert [r.event for r in fsm.history(mid)].count("approval") == 1, story
        assert fsm.machine(mid).current_state == "SHIP", story


def test_in_the_celery_mode_a_gate_opens_with_its_entry_not_with_the_move_to_it(fsm: Fsm) -> None:
    """The celery mode applies an ack and enters the next state in two transactions (an
    fsm.enter_state task between them): a machine can read as in REVIEW before its gate is
    open, and a decision then is refused, said so, and counted nowhere; once entered, the gate
    counts the same people's decisions (the integration test waits for the open gate, not the
    state: on a loaded box the task came seconds later and every decision was refused)."""
    tester = fsm.agent("tester")
    mid = fsm.start("test_gate")
    [build] = tester.tasks()
    [step] = fsm.engine.inbox.apply([Inbound(json.dumps(ack(build)), None)])
    assert fsm.machine(mid).current_state == "REVIEW" and _gates(fsm, mid) == []
    with pytest.raises(GateClosed, match=r"the gate at REVIEW is not open \(yet\)"):
        _decide(fsm, mid, "alice", target="staging")
    fsm.enter_all([step])  # the fsm.enter_state task
    assert _decide(fsm, mid, "alice", target="staging").approvals == 1
    assert _decide(fsm, mid, "bob", target="staging").moved_to == "SHIP"
