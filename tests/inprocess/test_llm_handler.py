"""The LLM agent's handler against the scripted OpenAI-compatible endpoint served here (real
HTTP on the loopback, no Redis): a broken answer corrected, a 429 and a 503 waited out after the
server's Retry-After, a wait that would pass the deadline refused, the contract broken too often
failing the attempt, and every call and wait sent as a heartbeat."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from fsm_celery.agent.llm import LlmHandler
from fsm_celery.agent.scripted_llm import Script, Served
from fsm_celery.agent.sdk import Failed
from fsm_celery.agent.task import Task
from fsm_celery.config import Settings
from fsm_celery.core.messages import StateTask


def _task(seconds: float = 60.0) -> tuple[Task, list[dict[str, Any]]]:
    sent: list[dict[str, Any]] = []
    message = StateTask(
        machine_id=uuid.uuid4(),
        machine_type="research_pipeline",
        state="REVIEWING",
        attempt=1,
        context={"taskState": {"query": "q"}},
        prompt="Review the analysis",
        required_output=["taskState", "approved"],
        timeout=int(seconds * 1000),
        deadline=datetime.now(UTC) + timedelta(seconds=seconds),
        task_token="t",
        heartbeat_timeout=None,
    )
    return Task(message, sent.append), sent


def _handler(url: str, corrections: int = 2) -> LlmHandler:
    prices = {"m": {"input": 1.0, "output": 2.0}}
    settings = Settings(
        llm_base_url=url, llm_model="m", llm_prices=prices, llm_max_corrections=corrections
    )
    return LlmHandler(settings)


@pytest.mark.parametrize("status", [429, 503])
def test_a_broken_answer_is_corrected_and_a_busy_server_waited_out(status: int) -> None:
    script = Script(bad_first=True, first_status=status, retry_after=0.5)
    with Served(script) as served:
        task, sent = _task()
        output = _handler(served.url)(task, "reviewer")
    assert output["approved"] is True and output["taskState"] == {"query": "q"}
    assert output["tokensUsed"] > 0 and output["cost"] > 0
    assert len(script.requests) == 3  # the refused one, the broken answer, its correction
    correction = script.requests[-1]["messages"]
    assert [m["role"] for m in correction] == ["system", "user", "assistant", "user"]
    assert "'approved' is a required property" in correction[-1]["content"]
    progress = [m["progress"] for m in sent if m["type"] == "state_heartbeat"]
    assert progress == [
        "asking m",
        f"m answered {status}; again in 0.5s",
        "asking m (correction 1)",
    ]


def test_a_wait_past_the_deadline_fails_at_once() -> None:
    script = Script(first_status=429, retry_after=30)
    with Served(script) as served:
        task, _ = _task(seconds=5)
        with pytest.raises(Failed, match=r"TimeoutError: .*past the deadline"):
            _handler(served.url)(task, "reviewer")
    assert len(script.requests) == 1  # not asked again: the wait would pass the deadline


def test_answers_that_keep_breaking_the_contract_fail_the_attempt() -> None:
    script = Script(answers={"REVIEWING": {}}, bad_first=True)
    with Served(script) as served:
        task, _ = _task()
        with pytest.raises(Failed, match="broke the contract in 1 answer;") as failed:
            _handler(served.url, corrections=0)(task, "reviewer")
        assert failed.value.output["tokensUsed"] > 0  # spent all the same: it counts
