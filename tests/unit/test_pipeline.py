"""The research pipeline in-process: TaskState round trips, agents, and the orchestrator."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from fsm_celery.pipeline import AgentOrchestrator, Message, TaskState, TaskStatus
from fsm_celery.pipeline.agents import AnalyzerAgent, ResearchAgent, ReviewerAgent

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=10,
)
task_states = st.builds(
    TaskState,
    query=st.text(),
    status=st.sampled_from(TaskStatus),
    findings=st.lists(st.text()),
    sources=st.lists(st.text()),
    analysis=st.text(),
    feedback=st.text(),
    approved=st.booleans(),
    iteration=st.integers(min_value=0, max_value=50),
    max_iterations=st.integers(min_value=1, max_value=50),
    messages=st.lists(st.builds(Message, st.text(), st.text(), st.integers(0, 50))),
    error=st.none() | st.text(),
    metadata=st.dictionaries(st.text(), json_values, max_size=4),
)


@settings(max_examples=200, deadline=None)
@given(task_states)
def test_task_state_round_trips_through_json_exactly(state: TaskState) -> None:
    again = TaskState.from_dict(json.loads(json.dumps(state.to_dict())))
    assert again == state
    assert again.to_dict() == state.to_dict()


def test_unknown_fields_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown TaskState fields: colour"):
        TaskState.from_dict({**TaskState("q").to_dict(), "colour": "red"})


def test_agents_return_a_new_state_and_leave_the_old_one_alone() -> None:
    state = TaskState("q")
    before = state.to_dict()
    for agent in (ResearchAgent(), AnalyzerAgent(), ReviewerAgent()):
        assert agent.process(state) is not state
    assert state.to_dict() == before


def test_mock_agents_are_deterministic() -> None:
    state = TaskState("why is the sky blue")
    assert ResearchAgent().process(state) == ResearchAgent().process(state)
    assert AnalyzerAgent().process(state) == AnalyzerAgent().process(state)


def test_agents_can_ask_a_language_model() -> None:
    researched = ResearchAgent(llm=lambda prompt: "one\ntwo").process(TaskState("q"))
    assert researched.findings == ["one", "two"]
    reviewed = ReviewerAgent(llm=lambda prompt: "APPROVE, well argued").process(researched)
    assert reviewed.approved


@pytest.mark.parametrize(
    ("rejections", "analyses", "status"),
    [(0, 1, TaskStatus.COMPLETE), (2, 3, TaskStatus.COMPLETE), (3, 3, TaskStatus.FAILED)],
)
def test_the_revision_loop_is_bounded_by_max_iterations(
    rejections: int, analyses: int, status: TaskStatus
) -> None:
    orchestrator = AgentOrchestrator()
    final = orchestrator.run("q", max_iterations=3, rejections=rejections)
    assert (final.status, final.iteration) == (status, analyses)
    assert orchestrator.visited.count("ANALYZING") == analyses
    agents = [m.agent for m in final.messages]
    assert agents[:2] == ["intake", "researcher"]
    assert agents[2:] == ["analyzer", "reviewer"] * analyses


def test_an_agent_that_raises_fails_the_run_with_its_error() -> None:
    final = AgentOrchestrator().run("   ")
    assert final.status is TaskStatus.FAILED
    assert final.error == "ValueError: the query is empty"
