"""Acceptance: pause, resume, cancel, retry and force behave as documented and are audited."""

from __future__ import annotations

import pytest

from fsm_celery.exceptions import CommandRefused
from tests.integration.conftest import ONE_MODE
from tests.support.agents import ScriptedAgent
from tests.support.messages import SILENT, Reply
from tests.support.processes import FsmEnv


def _last(env: FsmEnv, mid: object) -> tuple[str, str | None, str, str | None, str | None]:
    row = env.client.history(mid)[-1]  # type: ignore[arg-type]
    return row.event, row.from_state, row.to_state, row.actor, row.reason


@ONE_MODE
def test_pause_stops_dispatch_and_resume_enters_the_state_again(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"FIRST": [SILENT]}) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        paused = fsm.client.pause(mid, actor="ops@example", reason="agent maintenance")
        assert (paused.status, paused.current_state, paused.deadline_at) == (
            "paused",
            "FIRST",
            None,
        )
        assert _last(fsm, mid) == ("pause", "FIRST", "FIRST", "ops@example", "agent maintenance")
        resumed = fsm.client.resume(mid, actor="ops@example", reason="back")
        assert resumed.status == "running"
        retried = agent.wait_for_tasks(2)
        assert (retried["state"], retried["attempt"]) == ("FIRST", 3)
        assert fsm.wait_until_done(mid).status == "completed"
    events = [row.event for row in fsm.client.history(mid)]
    assert events == ["start", "pause", "resume", "ack", "ack"]


@ONE_MODE
def test_cancel_ends_the_machine_where_it_stands(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"SECOND": [SILENT]}) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(2)
        info = fsm.client.cancel(mid, actor="ops", reason="duplicate issue")
    assert (info.status, info.current_state) == ("cancelled", "SECOND")
    assert _last(fsm, mid) == ("cancel", "SECOND", "SECOND", "ops", "duplicate issue")
    with pytest.raises(CommandRefused, match="cannot resume a cancelled machine"):
        fsm.client.resume(mid, actor="ops")


@ONE_MODE
def test_retry_dispatches_the_current_state_again_at_once(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"FIRST": [SILENT]}) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        fsm.client.retry(mid, actor="ops", reason="agent restarted")
        assert fsm.wait_until_done(mid).status == "completed"
    assert [t["state"] for t in agent.tasks] == ["FIRST", "FIRST", "SECOND"]
    assert [t["attempt"] for t in agent.tasks] == [1, 2, 3]
    assert fsm.client.history(mid)[1].event == "retry"


@ONE_MODE
def test_retry_of_a_failed_machine_resumes_from_the_state_that_failed(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"SECOND": [Reply(success=False, error="disk full")]}) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        failed = fsm.wait_until_done(mid)
        assert (failed.status, failed.current_state, failed.error) == (
            "failed",
            "FAILED",
            "disk full",
        )
        fsm.client.retry(mid, actor="ops", reason="disk cleaned")
        done = fsm.wait_until_done(mid)
    assert (done.status, done.current_state, done.error) == ("completed", "DONE", None)
    assert fsm.visited(mid) == ["FIRST", "SECOND", "FAILED", "SECOND", "DONE"]


@ONE_MODE
def test_force_moves_the_machine_to_the_named_state(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"FIRST": [SILENT]}) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        fsm.client.force(mid, "SECOND", actor="ops", reason="first step done by hand")
        assert fsm.wait_until_done(mid).status == "completed"
    assert _last(fsm, mid)[0] == "ack"
    assert fsm.visited(mid) == ["FIRST", "SECOND", "DONE"]
    forced = fsm.client.history(mid)[1]
    assert (forced.event, forced.actor, forced.reason) == (
        "force",
        "ops",
        "first step done by hand",
    )


@ONE_MODE
def test_force_into_a_terminal_state_ends_the_machine(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"FIRST": [SILENT]}) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        info = fsm.client.force(mid, "DONE", actor="ops", reason="nothing left to do")
    assert (info.status, info.current_state) == ("completed", "DONE")


@ONE_MODE
def test_refused_commands_say_why_and_change_nothing(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"FIRST": [SILENT]}) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        with pytest.raises(CommandRefused, match="cannot resume a running machine"):
            fsm.client.resume(mid, actor="ops")
        with pytest.raises(CommandRefused, match="one of FIRST, SECOND, DONE, FAILED"):
            fsm.client.force(mid, "NOWHERE", actor="ops")
        assert len(fsm.client.history(mid)) == 1
        assert fsm.client.get_machine(mid).status == "running"
