"""Acceptance: machines run to their end through a real worker, bridge, Redis and PostgreSQL."""

from __future__ import annotations

from tests.integration.conftest import ONE_MODE
from tests.support.agents import ScriptedAgent
from tests.support.messages import FIX_BUG_STATES, OUTPUTS, Reply
from tests.support.processes import FsmEnv

CONTEXT = {"projectName": "sla-api", "githubIssue": 726}
BUILD_WITH_SPEC = [
    "ANALYZE_ISSUE",
    "WRITE_SPEC",
    "CREATE_PROJECT",
    "WRITE_CODE",
    "RUN_TESTS",
    "COMMIT_PUSH",
    "DEPLOY_STAGING",
    "VERIFY_STAGING",
    "DEPLOY_PROD",
    "COMPLETE",
]


@ONE_MODE
def test_build_project_with_spec_visits_write_spec(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm) as agent:
        mid = fsm.client.start_machine("cto_build_project", CONTEXT, agent_id=agent.id)
        info = fsm.wait_until_done(mid)
    assert info.status == "completed"
    assert fsm.visited(mid) == BUILD_WITH_SPEC
    assert info.context["specPath"] == OUTPUTS["WRITE_SPEC"]["specPath"]
    assert info.github_issue == 726


@ONE_MODE
def test_build_project_without_spec_skips_write_spec(fsm: FsmEnv) -> None:
    script = {"ANALYZE_ISSUE": [Reply(output={"needsSpec": False, "complexity": "low"})]}
    with ScriptedAgent(fsm, script) as agent:
        mid = fsm.client.start_machine("cto_build_project", CONTEXT, agent_id=agent.id)
        info = fsm.wait_until_done(mid)
    assert info.status == "completed"
    assert fsm.visited(mid) == [s for s in BUILD_WITH_SPEC if s != "WRITE_SPEC"]


def test_fix_bug_runs_to_complete(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm) as agent:
        mid = fsm.client.start_machine("cto_fix_bug", CONTEXT, agent_id=agent.id)
        assert fsm.wait_until_done(mid).status == "completed"
    assert fsm.visited(mid) == FIX_BUG_STATES


@ONE_MODE
def test_infrastructure_check_runs_to_complete(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm) as agent:
        mid = fsm.client.start_machine("cto_infrastructure_check", {}, agent_id=agent.id)
        info = fsm.wait_until_done(mid)
    assert info.status == "completed"
    assert fsm.visited(mid) == [
        "CHECK_UPTIME",
        "CHECK_CERTS",
        "CHECK_CONTAINERS",
        "GENERATE_REPORT",
        "COMPLETE",
    ]
    prompt = next(t["prompt"] for t in agent.tasks if t["state"] == "GENERATE_REPORT")
    assert f"Uptime: {OUTPUTS['CHECK_UPTIME']['uptime']}." in prompt
    assert f"Containers: {OUTPUTS['CHECK_CONTAINERS']['containers']}." in prompt


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


@ONE_MODE
def test_failing_tests_past_the_loop_bound_fail_the_machine(fsm: FsmEnv) -> None:
    script = {"RUN_TESTS": [Reply(success=False, error="tests failed")] * 4}
    with ScriptedAgent(fsm, script) as agent:
        mid = fsm.client.start_machine(
            "cto_build_project", {**CONTEXT, "maxRetries": 3}, agent_id=agent.id
        )
        info = fsm.wait_until_done(mid)
    assert info.status == "failed"
    history = fsm.client.history(mid)
    last = history[-1]
    assert (last.from_state, last.to_state, last.success) == ("RUN_TESTS", "FAILED", False)
    assert "loop limit reached" in (last.error_message or "")
    assert "tests failed" in (last.error_message or "")
    assert [r.to_state for r in history].count("WRITE_CODE") == 4
    assert info.error == last.error_message
