"""The LLM agent's own logic, without I/O: the contract asked for, an answer's problems, the
model chosen for a state, the Retry-After read, and the cost of the tokens."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest

from fsm_celery.agent.llm import (
    LlmHandler,
    Spent,
    _retry_after,
    contract_of,
    messages_for,
    problems_of,
)
from fsm_celery.agent.task import Task
from fsm_celery.config import Settings
from fsm_celery.config_agents import LlmPrice
from fsm_celery.core.messages import StateTask


def _task(
    required: list[str], state: str = "REVIEWING", output_schema: dict[str, Any] | None = None
) -> Task:
    message = StateTask(
        machine_id=uuid.uuid4(),
        machine_type="research_pipeline",
        state=state,
        attempt=1,
        context={},
        prompt="Review",
        required_output=required,
        timeout=60_000,
        deadline=datetime.now(UTC) + timedelta(seconds=60),
        task_token="t",
        heartbeat_timeout=None,
        output_schema=output_schema,
    )
    return Task(message, lambda _: None)


def test_the_contract_is_an_object_with_the_required_keys() -> None:
    schema = contract_of(_task(["taskState", "approved"]))
    assert schema["required"] == ["taskState", "approved"]
    assert problems_of(schema, {"taskState": {}, "approved": True}) == []
    assert problems_of(schema, {"taskState": {}}) == ["/: 'approved' is a required property"]
    assert problems_of(schema, ["not", "an", "object"])[0].startswith("/: ")


def test_problems_are_bounded() -> None:
    schema = contract_of(_task([f"k{i}" for i in range(100)]))
    assert len(problems_of(schema, {})) == 20


def test_the_model_is_the_states_then_the_agent_types_then_the_default() -> None:
    settings = Settings(
        llm_base_url="http://127.0.0.1:1/v1",
        llm_model="default-model",
        llm_models={"research_pipeline.REVIEWING": "state-model", "analyzer": "type-model"},
    )
    handler = LlmHandler(settings, client=object())
    assert handler.model_for(_task([], "REVIEWING"), "reviewer") == "state-model"
    assert handler.model_for(_task([], "ANALYZING"), "analyzer") == "type-model"
    assert handler.model_for(_task([], "PENDING"), "researcher") == "default-model"


def test_an_llm_agent_without_endpoint_or_model_is_refused_with_the_setting_named() -> None:
    with pytest.raises(ValueError, match="FSM_LLM_BASE_URL"):
        LlmHandler(Settings(llm_model="m"), client=object())
    with pytest.raises(ValueError, match="FSM_LLM_MODEL"):
        LlmHandler(Settings(llm_base_url="http://127.0.0.1:1/v1"), client=object())


@pytest.mark.parametrize(
    ("headers", "wait"),
    [
        ({"retry-after": "3"}, 3.0),
        ({"retry-after-ms": "250"}, 0.25),
        ({}, None),
        ({"retry-after": "soon"}, None),
    ],
)
def test_the_servers_retry_after_is_read(headers: dict[str, str], wait: float | None) -> None:
    error: Any = SimpleNamespace(response=SimpleNamespace(headers=headers))
    assert _retry_after(error) == wait


def test_tokens_are_priced_per_million() -> None:
    spent = Spent().plus(1_000, 500, LlmPrice(input=2.0, output=8.0)).plus(10, 10, None)
    assert spent.tokens == 1_520
    assert spent.cost == pytest.approx(0.006)


def test_the_states_output_schema_is_the_contract_and_a_refusal_is_told_to_the_model() -> None:
    schema = {"type": "object", "properties": {"approved": {"type": "boolean"}}}
    task = _task(["approved"], output_schema=schema)
    schema = contract_of(task)
    assert problems_of(schema, {"approved": "yes"}) == ["/approved: 'yes' is not of type 'boolean'"]
    task.problems = [{"pointer": "/approved", "message": "'yes' is not of type 'boolean'"}]
    prompt = messages_for(task, schema)[-1]["content"]
    assert "Your last answer was refused:\n- /approved: 'yes' is not of type 'boolean'" in prompt
