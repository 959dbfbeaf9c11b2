"""The mock agents' script: fixed outputs, injected failures and silence."""

from __future__ import annotations

import pytest

from fsm_celery.agent.mock import (
    ASPECTS,
    OUTPUTS,
    InjectedFailure,
    MockScript,
    research,
    review,
    split_query,
)
from fsm_celery.agent.sdk import NoAck


def test_outputs_are_the_scripted_ones() -> None:
    assert MockScript().respond("m", "WRITE_SPEC") == OUTPUTS["WRITE_SPEC"]


def test_failures_hit_the_chosen_visits_only() -> None:
    script = MockScript(failures={"RUN_TESTS": frozenset({2})})
    assert script.respond("m", "RUN_TESTS")["passed"] is True
    with pytest.raises(InjectedFailure, match="visit 2"):
        script.respond("m", "RUN_TESTS")
    assert script.respond("m", "RUN_TESTS")["passed"] is True
    assert script.respond("other", "RUN_TESTS")["passed"] is True  # visits count per machine


def test_a_failure_without_visits_fails_every_time() -> None:
    script = MockScript(failures={"DEPLOY": frozenset()})
    for _ in range(3):
        with pytest.raises(InjectedFailure):
            script.respond("m", "DEPLOY")


def test_silent_states_are_never_answered() -> None:
    with pytest.raises(NoAck):
        MockScript(silent=frozenset({"CHECK_CERTS"})).respond("m", "CHECK_CERTS")


def test_same_seed_same_think_times() -> None:
    a, b = MockScript(seed=3, think=(0, 1)), MockScript(seed=3, think=(0, 1))
    assert a.think_seconds("m", 2) == b.think_seconds("m", 2)
    assert a.think_seconds("m", 2) != MockScript(seed=4, think=(0, 1)).think_seconds("m", 2)


def test_a_state_whose_answer_follows_its_input_is_answered_from_the_context() -> None:
    plan = MockScript().respond("m", "PLANNING", "research_fanout", {"query": "edge caching"})
    assert plan == split_query({"query": "edge caching"})
    assert len(plan["subQuestions"]) == len(ASPECTS)
    assert all("edge caching" in q for q in plan["subQuestions"])


def test_a_child_is_answered_by_the_type_that_names_its_place() -> None:
    script = MockScript()
    child = "research_fanout.RESEARCHING"
    first, second = ({"query": "q", "subQuestion": s} for s in ("Who uses q?", "What is q?"))
    assert script.respond("a", "RESEARCH", child, first) == research(first)
    assert script.respond("b", "RESEARCH", child, first) == research(first)  # deterministic
    assert research(first)["finding"] != research(second)["finding"]
    assert script.respond("c", "RESEARCH", "other_type", first) == {}  # not this place


def test_the_reviewer_sends_back_an_analysis_without_findings() -> None:
    found = {"findings": [{"finding": "f"}, {"status": "failed", "error": "boom"}]}
    assert review(found)["approved"] is True
    assert review({"findings": [{"status": "failed", "error": "boom"}]})["approved"] is False
