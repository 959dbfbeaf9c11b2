"""Acceptance: machines run to their end through a real worker, bridge, Redis and PostgreSQL, in
each transition mode. Which states the shipped definitions visit for which outputs is the
engine's (tests/inprocess/test_runs.py)."""

from __future__ import annotations

from tests.support.agents import ScriptedAgent
from tests.support.messages import FIX_BUG_STATES, Reply
from tests.support.processes import FsmEnv

CONTEXT = {"projectName": "sla-api", "githubIssue": 726}


def test_fix_bug_runs_to_complete(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm) as agent:
        mid = fsm.client.start_machine("cto_fix_bug", CONTEXT, agent_id=agent.id)
        assert fsm.wait_until_done(mid).status == "completed"
    assert fsm.visited(mid) == FIX_BUG_STATES


def test_state_task_carries_the_seed_fields_and_the_safety_additions(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm) as agent:
        mid = fsm.client.start_machine("cto_fix_bug", CONTEXT, agent_id=agent.id)
        fsm.wait_until_done(mid)
    first = agent.tasks[0]
    assert first["type"] == "state_task"
    assert first["machineId"] == str(mid)
    assert first["state"] == "ANALYZE_BUG"
    assert first["context"]["projectName"] == "sla-api"
    assert "#726" in first["prompt"]
    assert first["requiredOutput"] == ["reproduced"]
    assert first["timeout"] == 600_000
    assert first["attempt"] == 1
    assert len(first["taskToken"]) == 64
    assert first["deadline"]


def test_failing_tests_loop_back_to_write_code_then_complete(fsm: FsmEnv) -> None:
    script = {
        "RUN_TESTS": [Reply(success=False, error="2 tests failed"), Reply(output={"passed": False})]
    }
    with ScriptedAgent(fsm, script) as agent:
        mid = fsm.client.start_machine("cto_build_project", CONTEXT, agent_id=agent.id)
        info = fsm.wait_until_done(mid)
    assert info.status == "completed"
    visited = fsm.visited(mid)
    loop = ["WRITE_CODE", "RUN_TESTS"]
    assert visited[3:10] == loop * 3 + ["COMMIT_PUSH"]
    assert info.context["retryCount"] == 2
