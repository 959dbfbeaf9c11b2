"""Tool states in the engine, against real PostgreSQL and Redis: entering one records its call
(sent once the transaction commits, nothing to any agent), the call's arguments rendered from
the context, its result applied as the attempt's answer with the tool as actor, a result for a
machine that moved on or was paused recorded as rejected and changing nothing, and arguments
that cannot be rendered failing the attempt with nothing called. The worker's side (the MCP
call itself) is tests/integration/test_tool_states.py's."""

from __future__ import annotations

import json

import pytest

from fsm_celery.core import tool
from fsm_celery.core.admin import Action, Command
from fsm_celery.core.loader import load_text
from fsm_celery.core.steps import Next
from tests.inprocess.conftest import Fsm

CONTEXT = {"projectName": "sla-api", "githubIssue": 740, "key": "k"}


@pytest.fixture
def calls(fsm: Fsm) -> list[tuple[str, int]]:
    """The calls the engine hands its Caller (the worker's fsm.call_tool tasks), as
    (state, attempt): the port, recorded instead of sent to a broker no worker reads here."""
    made: list[tuple[str, int]] = []

    def record(steps: Next) -> None:
        made.extend((step.state, step.attempt) for step in steps)

    fsm.engine.runtime.caller = record
    return made


def test_entering_a_tool_state_records_its_call_and_its_result_moves_the_machine(
    fsm: Fsm, calls: list[tuple[str, int]]
) -> None:
    mid = fsm.start("test_tool", CONTEXT)
    assert calls == [("RUN_TESTS", 1)]
    assert fsm.agent("tester").tasks() == []  # no state_task: a worker calls the tool
    pending = fsm.engine.tools.pending(mid, 1)
    assert pending is not None
    assert pending.arguments == {"project": "sla-api", "issue": 740}
    assert pending.declares_contract and fsm.machine(mid).deadline_at is not None
    fsm.enter_all(fsm.engine.tools.finish(pending, tool.Outcome({"passed": True, "coverage": 9})))
    machine = fsm.machine(mid)
    assert machine.current_state == "FLAKY" and machine.context["coverage"] == 9
    assert calls == [("RUN_TESTS", 1), ("FLAKY", 2)]
    row = fsm.history(mid)[-1]
    assert (row.event, row.actor, row.success) == ("ack", "mcp:checks/run_tests", True)
    assert json.loads(row.reason or "") == {"project": "sla-api", "issue": 740}


def test_a_result_that_breaks_the_contract_is_the_attempts_invalid_output(
    fsm: Fsm, calls: list[tuple[str, int]]
) -> None:
    mid = fsm.start("test_tool", CONTEXT)
    pending = fsm.engine.tools.pending(mid, 1)
    assert pending is not None
    fsm.engine.tools.finish(pending, tool.Outcome({"passed": "yes", "coverage": 1}))
    row = fsm.history(mid)[-1]
    assert (row.failure, row.to_state) == ("invalid_output", "FAILED")
    assert "/passed" in (row.error_message or "")


def test_a_result_for_a_paused_machine_changes_nothing_and_is_recorded(
    fsm: Fsm, calls: list[tuple[str, int]]
) -> None:
    mid = fsm.start("test_tool", CONTEXT)
    pending = fsm.engine.tools.pending(mid, 1)
    assert pending is not None
    fsm.engine.admin.command(mid, Command(Action.PAUSE, "admin"))
    assert fsm.engine.tools.pending(mid, 1) is None  # a repeated task calls nothing
    fsm.engine.tools.finish(pending, tool.Outcome({"passed": True, "coverage": 1}))
    machine = fsm.machine(mid)
    assert (machine.status, machine.current_state) == ("paused", "RUN_TESTS")
    assert fsm.rejections(mid)[-1] == "stale_attempt"  # the pause ended the attempt


def test_arguments_that_cannot_be_rendered_fail_the_attempt_with_nothing_called(
    fsm: Fsm, calls: list[tuple[str, int]]
) -> None:
    definition = load_text(
        """
type: test_tool_args
agent_type: tester
initial_state: CALL
states:
  - name: CALL
    tool: {server: checks, name: echo, arguments: {text: "{{ missing }}"}}
    on_success: DONE
    on_failure: FAILED
  - name: DONE
    terminal: completed
  - name: FAILED
    terminal: failed
"""
    )
    fsm.engine.catalog.load([definition])
    mid = fsm.start("test_tool_args", {})
    assert calls == []
    row = fsm.history(mid)[-1]
    assert (row.event, row.to_state) == ("dispatch_error", "CALL")  # failed where it is
    assert fsm.machine(mid).status == "failed"
    assert "argument text" in (row.error_message or "") and "missing" in (row.error_message or "")
