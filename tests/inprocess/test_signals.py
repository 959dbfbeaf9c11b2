"""Outside events against real PostgreSQL and Redis: applied to a machine waiting for one,
kept when early and consumed on entering the state, one per key, bounded, refused when they fit
nothing (tests/fixtures/definitions/test_wait.yaml waits for pr_merged)."""

from __future__ import annotations

from typing import Any
from uuid import UUID

import pytest

from fsm_celery.core.admin import Action, Command
from fsm_celery.exceptions import EventRefused, InvalidEvent
from fsm_celery.store import signals as store
from tests.inprocess.conftest import Fsm, ack


def _sent(fsm: Fsm) -> list[str]:
    return [task["state"] for task in fsm.agent("tester").tasks()]


def _ack_last(fsm: Fsm, **reply: Any) -> None:
    fsm.receive(ack(fsm.agent("tester").tasks()[-1], **reply))


def _events(fsm: Fsm, mid: UUID) -> list[Any]:
    with fsm.engine.db.connect() as conn:
        return list(store.machine_events_txn(conn, mid))


def _waiting(fsm: Fsm) -> UUID:
    mid = fsm.start("test_wait")
    _ack_last(fsm)
    machine = fsm.machine(mid)
    assert (machine.current_state, machine.status) == ("WAIT_MERGE", "running")
    assert machine.deadline_at is not None
    return mid


def test_an_event_moves_the_machine_waiting_for_it_and_its_payload_is_the_output(
    fsm: Fsm,
) -> None:
    mid = _waiting(fsm)
    assert _sent(fsm) == ["BUILD"]  # nothing went to an agent for the wait
    done = fsm.engine.signals.send(mid, "pr_merged", {"merged": True, "number": 12}, "github")
    assert (done.outcome, done.moved_to) == ("applied", "DEPLOY")
    machine = fsm.machine(mid)
    assert machine.current_state == "DEPLOY" and machine.context["number"] == 12
    assert _sent(fsm) == ["BUILD", "DEPLOY"]
    last = fsm.history(mid)[-1]
    assert (last.event, last.actor, last.reason, last.output) == (
        "signal",
        "github",
        "pr_merged",
        {"merged": True, "number": 12},
    )
    [event] = _events(fsm, mid)
    assert (event.outcome, event.attempt) == ("applied", last.attempt)


def test_a_guard_on_the_payload_chooses_the_edge(fsm: Fsm) -> None:
    mid = _waiting(fsm)
    done = fsm.engine.signals.send(mid, "pr_merged", {"merged": False}, "github")
    assert done.moved_to == "BUILD"
    assert fsm.machine(mid).context["retryCount"] == 1


def test_an_early_event_is_kept_and_consumed_on_entering_the_state(fsm: Fsm) -> None:
    mid = fsm.start("test_wait")
    kept = fsm.engine.signals.send(mid, "pr_merged", {"merged": True}, "ci", key="delivery-1")
    assert (kept.outcome, kept.state) == ("kept", "BUILD")
    again = fsm.engine.signals.send(mid, "pr_merged", {"merged": True}, "ci", key="delivery-1")
    assert again.outcome == "duplicate"
    _ack_last(fsm)  # BUILD done: WAIT_MERGE is entered, and its kept event decides it at once
    machine = fsm.machine(mid)
    assert machine.current_state == "DEPLOY"
    assert _sent(fsm) == ["BUILD", "DEPLOY"]
    [event] = _events(fsm, mid)
    assert (event.outcome, event.key) == ("applied", "delivery-1")
    assert [h.event for h in fsm.history(mid)] == ["start", "ack", "signal"]


def test_what_an_event_is_refused_for_changes_nothing(fsm: Fsm) -> None:
    mid = fsm.start("test_wait")
    with pytest.raises(InvalidEvent, match="waits for no 'deployed' event \\(pr_merged\\)"):
        fsm.engine.signals.send(mid, "deployed", {}, "ci")
    with pytest.raises(InvalidEvent, match="merged"):
        fsm.engine.signals.send(mid, "pr_merged", {"merged": "yes"}, "ci")
    with pytest.raises(InvalidEvent, match="NUL"):
        fsm.engine.signals.send(mid, "pr_merged", {"merged": True}, "c\x00i")
    with pytest.raises(InvalidEvent, match="over 65536"):
        fsm.engine.signals.send(mid, "pr_merged", {"merged": True, "x": "y" * 70_000}, "ci")
    assert _events(fsm, mid) == []
    for n in range(fsm.settings.max_kept_events):
        fsm.engine.signals.send(mid, "pr_merged", {"merged": n % 2 == 0}, "ci")
    with pytest.raises(EventRefused, match="10 pr_merged events are kept for it already"):
        fsm.engine.signals.send(mid, "pr_merged", {"merged": True}, "ci")
    fsm.enter_all(fsm.engine.admin.command(mid, Command(Action.CANCEL, "ops")))
    with pytest.raises(EventRefused, match="cancelled"):
        fsm.engine.signals.send(mid, "pr_merged", {"merged": True}, "ci")
    assert fsm.machine(mid).current_state == "BUILD"


def test_no_event_before_the_deadline_takes_on_timeout(fsm: Fsm) -> None:
    mid = _waiting(fsm)
    fsm.clock.advance(3601)
    fsm.scan()
    machine = fsm.machine(mid)
    assert (machine.current_state, machine.status) == ("FAILED", "failed")
    last = fsm.history(mid)[-1]
    assert last.event == "timeout" and "no pr_merged event" in (last.error_message or "")
    assert _sent(fsm) == ["BUILD"]  # no state_cancel, no task: no agent was waited for
    assert fsm.agent("tester").cancels == []


def test_a_kept_event_the_state_refuses_is_consumed_as_refused_and_the_state_waits(
    fsm: Fsm,
) -> None:
    mid = fsm.start("test_wait")
    fsm.engine.signals.send(mid, "pr_merged", {"merged": True, "number": 3}, "ci")
    with fsm.engine.db.begin() as conn:  # as if kept under an older version of the schema
        from sqlalchemy import update

        from fsm_celery.store.tables import machine_events

        conn.execute(update(machine_events).values(payload={"number": 0}))
    _ack_last(fsm)
    assert fsm.machine(mid).current_state == "WAIT_MERGE"
    [event] = _events(fsm, mid)
    assert event.outcome == "refused"


def test_an_event_sent_again_with_its_key_after_the_machine_ended_is_a_duplicate(
    fsm: Fsm,
) -> None:
    mid = _waiting(fsm)
    done = fsm.engine.signals.send(mid, "pr_merged", {"merged": True}, "ci", key="ci-run-9")
    assert done.outcome == "applied"
    _ack_last(fsm)  # DEPLOY done: the machine has ended
    assert fsm.machine(mid).status == "completed"
    again = fsm.engine.signals.send(mid, "pr_merged", {"merged": True}, "ci", key="ci-run-9")
    assert (again.outcome, again.state) == ("duplicate", "DONE")
    with pytest.raises(EventRefused, match="completed"):  # a new key still finds it ended
        fsm.engine.signals.send(mid, "pr_merged", {"merged": True}, "ci", key="ci-run-10")
    assert len(_events(fsm, mid)) == 1
