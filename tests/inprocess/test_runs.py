"""The shipped definitions' paths, run on the engine in the test's process: which states a
machine visits for the outputs its agent gives (tests/integration/test_machines_run.py runs
machines through real processes in each transition mode)."""

from __future__ import annotations

import uuid
from typing import Any
from uuid import UUID

from fsm_celery.agent.mock import InjectedFailure, MockScript, research
from fsm_celery.pipeline.orchestrator import as_node, default_agents, pipeline_context
from fsm_celery.pipeline.state import TaskState
from tests.inprocess.conftest import Agent, Fsm, ack
from tests.support.messages import OUTPUTS

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


def run(
    fsm: Fsm, machine_type: str, context: dict[str, Any], **script: list[dict[str, Any]]
) -> tuple[UUID, Agent]:
    """Start a machine and answer each of its state_tasks as the script says for its state
    (an ack with the state's usual output once the script runs out), until it ends."""
    agent_id = uuid.uuid4()
    agent = fsm.agent(str(agent_id))
    mid = fsm.start(machine_type, context, agent_id=agent_id)
    while fsm.machine(mid).status == "running":
        task = agent.task()
        replies = script.get(task["state"])
        later = fsm.receive(ack(task, **(replies.pop(0) if replies else {})))
        if later:  # retries wait out their backoff
            fsm.clock.advance(max(step.delay for step in later))
            fsm.enter_all(later)
    return mid, agent


def visited(fsm: Fsm, mid: UUID) -> list[str]:
    return [row.to_state for row in fsm.history(mid)]


def test_build_project_with_spec_visits_write_spec(fsm: Fsm) -> None:
    mid, _ = run(fsm, "cto_build_project", CONTEXT)
    machine = fsm.machine(mid)
    assert (machine.status, visited(fsm, mid)) == ("completed", BUILD_WITH_SPEC)
    assert machine.context["specPath"] == OUTPUTS["WRITE_SPEC"]["specPath"]
    assert machine.github_issue == 726


def test_build_project_without_spec_skips_write_spec(fsm: Fsm) -> None:
    analysis = {"output": {"needsSpec": False, "complexity": "low"}}
    mid, _ = run(fsm, "cto_build_project", CONTEXT, ANALYZE_ISSUE=[analysis])
    assert fsm.machine(mid).status == "completed"
    assert visited(fsm, mid) == [s for s in BUILD_WITH_SPEC if s != "WRITE_SPEC"]


def test_infrastructure_check_reports_what_the_checks_found(fsm: Fsm) -> None:
    mid, agent = run(fsm, "cto_infrastructure_check", {})
    assert fsm.machine(mid).status == "completed"
    assert visited(fsm, mid) == [
        "CHECK_UPTIME",
        "CHECK_CERTS",
        "CHECK_CONTAINERS",
        "GENERATE_REPORT",
        "COMPLETE",
    ]
    prompt = next(t["prompt"] for t in agent.seen if t["state"] == "GENERATE_REPORT")
    assert f"Uptime: {OUTPUTS['CHECK_UPTIME']['uptime']}." in prompt
    assert f"Containers: {OUTPUTS['CHECK_CONTAINERS']['containers']}." in prompt


def test_failing_tests_past_the_loop_bound_fail_the_machine(fsm: Fsm) -> None:
    failing = [{"success": False, "error": "tests failed"}] * 4
    mid, _ = run(fsm, "cto_build_project", {**CONTEXT, "maxRetries": 3}, RUN_TESTS=failing)
    machine, history = fsm.machine(mid), fsm.history(mid)
    last = history[-1]
    assert (machine.status, last.from_state, last.to_state, last.success) == (
        "failed",
        "RUN_TESTS",
        "FAILED",
        False,
    )
    assert "loop limit reached" in (last.error_message or "")
    assert "tests failed" in (last.error_message or "")
    assert [r.to_state for r in history].count("WRITE_CODE") == 4
    assert machine.error == last.error_message


def answer(task: dict[str, Any], script: MockScript | None = None) -> dict[str, Any]:
    """The mock agents' ack: the state's output, computed from the task's input where the
    output follows it."""
    return ack(task, output=(script or MockScript()).respond(**_asked(task)))


def _asked(task: dict[str, Any]) -> dict[str, Any]:
    return {
        "machine_id": task["machineId"],
        "state": task["state"],
        "machine_type": task["machineType"],
        "context": task["context"],
    }


def test_research_fanout_researches_its_sub_questions_three_at_a_time(fsm: Fsm) -> None:
    analyzer, researcher, reviewer = map(fsm.agent, ("analyzer", "researcher", "reviewer"))
    mid = fsm.start("research_fanout", {"query": "edge caching"})
    fsm.receive(answer(analyzer.task()))
    questions = fsm.machine(mid).context["subQuestions"]
    first = researcher.tasks()
    assert len(questions) == 4 and len(first) == 3  # max_concurrency: 3
    assert {t["machineType"] for t in first} == {"research_fanout.RESEARCHING"}
    assert [t["context"]["query"] for t in first] == ["edge caching"] * 3  # the input: the query
    fsm.receive(answer(first[0]))
    [last] = researcher.tasks()  # one ended, the fourth starts
    fsm.receive(*map(answer, [*first[1:], last]))
    joined = analyzer.task()
    findings = joined["context"]["findings"]
    assert [f["subQuestion"] for f in findings] == questions  # in item order
    assert [f["finding"] for f in findings] == [
        research({"query": "edge caching", "subQuestion": q})["finding"] for q in questions
    ]
    assert all(f["finding"] in joined["prompt"] for f in findings)
    fsm.receive(answer(joined))
    fsm.receive(answer(reviewer.task()))
    machine = fsm.machine(mid)
    assert (machine.status, visited(fsm, mid)) == (
        "completed",
        ["PLANNING", "RESEARCHING", "ANALYZING", "REVIEWING", "COMPLETE"],
    )


def test_research_fanout_tolerates_one_sub_question_that_fails(fsm: Fsm) -> None:
    analyzer, researcher = fsm.agent("analyzer"), fsm.agent("researcher")
    mid = fsm.start("research_fanout", {"query": "edge caching"})
    fsm.receive(answer(analyzer.task()))
    failing = MockScript(failures={"RESEARCH": frozenset()})
    for _ in range(20):  # four children, one of them tried three times
        tasks = researcher.tasks()
        if not tasks:
            break
        for task in tasks:
            hopeless = task["context"]["subQuestion"].startswith("Who uses")
            try:
                reply = answer(task, failing if hopeless else None)
            except InjectedFailure as exc:
                reply = ack(task, success=False, error=str(exc))
            later = fsm.receive(reply)
            if later:  # retries wait out their backoff
                fsm.clock.advance(max(step.delay for step in later))
                fsm.enter_all(later)
    assert fsm.machine(mid).current_state == "ANALYZING"
    joined = analyzer.task()
    *found, lost = joined["context"]["findings"]
    assert [set(f) for f in found] == [{"subQuestion", "finding", "sources"}] * 3
    assert lost["status"] == "failed" and "injected failure" in lost["error"]
    assert "(4) not researched: " in joined["prompt"]  # the error, in the analyzer's prompt


def test_research_pipeline_sends_each_state_to_an_agent_of_its_own_type(fsm: Fsm) -> None:
    agents = {t: fsm.agent(t) for t in ("researcher", "analyzer", "reviewer")}
    nodes = {state: as_node(agent) for state, agent in default_agents().items()}
    mid = fsm.start("research_pipeline", pipeline_context(TaskState("edge caching")))
    for agent_type in ("researcher", "researcher", "analyzer", "reviewer"):
        task = agents[agent_type].task()
        fsm.receive(ack(task, output=nodes[task["state"]](task["context"])))
    assert visited(fsm, mid) == ["PENDING", "RESEARCHING", "ANALYZING", "REVIEWING", "COMPLETE"]
    assert fsm.machine(mid).status == "completed"
