"""An agent that needs no code: a chat model behind any OpenAI-compatible endpoint works each
state it is handed (`fsm-celery agent --llm --agent-type T`).

For each state_task: the state's rendered prompt and the machine's context go to the model as
messages; the state's output contract (its output_schema, or its `required_output` keys) is the
structured-output schema asked for; an answer that is not JSON or breaks the contract is sent
back to the model as a correction turn, at most FSM_LLM_MAX_CORRECTIONS times, before the
attempt is answered as failed (the engine's retry policy takes it from there), with what it
spent; an answer the engine refuses all the same (state_ack_refused) is asked again with the
engine's problems. A rate limit (429) or a server error (5xx) is tried again after the server's
Retry-After (or a growing delay), never past the state's deadline; each call and each wait is a
heartbeat with progress text. The tokens each call used, and their cost by the price table
(FSM_LLM_PRICES), are reported in the ack (`tokensUsed`, `cost`): they count against the
machine's budget.

The model is FSM_LLM_MODEL, or FSM_LLM_MODELS's for the state (`machine_type.STATE`) or the
agent type.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fsm_celery.agent.sdk import ANY, Agent, Failed
from fsm_celery.agent.task import Task
from fsm_celery.config import Settings
from fsm_celery.config_agents import LlmPrice
from fsm_celery.core.contract import flaws, schema_of
from fsm_celery.traces import model_call

log = logging.getLogger(__name__)

MARGIN_SECONDS = 1.0  # kept before the deadline for the ack to travel
FIRST_DELAY = 1.0  # the wait before a retry the server did not time, doubling
LONGEST_DELAY = 60.0


@dataclass(frozen=True)
class Spent:
    """Tokens used and what they cost."""

    tokens: int = 0
    cost: float = 0.0

    def plus(self, prompt: int, completion: int, price: LlmPrice | None) -> Spent:
        cost = 0.0
        if price is not None:
            cost = (prompt * price.input + completion * price.output) / 1_000_000
        return Spent(self.tokens + prompt + completion, self.cost + cost)


def contract_of(task: Task) -> dict[str, Any]:
    """The JSON Schema an answer must meet: the task's output contract (its output_schema with
    its required keys), an object at the least."""
    return schema_of(task.output_schema, task.message.required_output) or {"type": "object"}


def problems_of(schema: Mapping[str, Any], output: Any) -> list[str]:
    """What is wrong with the answer, each as `pointer: message` (bounded as the engine's)."""
    if not isinstance(output, dict):
        return [f"/: the answer is a JSON {type(output).__name__}, not an object"]
    return [f"{f.pointer or '/'}: {f.message}" for f in flaws(schema, output)]


def messages_for(task: Task, schema: Mapping[str, Any]) -> list[dict[str, str]]:
    """The conversation that opens a state: what the agent is, the task, the context."""
    system = (
        f"You work state {task.state} (attempt {task.attempt}) of machine {task.machine_id}, "
        f"a {task.machine_type} state machine. Answer with one JSON object only, meeting "
        f"this JSON Schema: {json.dumps(schema, sort_keys=True)}"
    )
    user = f"{task.prompt}\n\nContext (JSON):\n{json.dumps(task.context, sort_keys=True)}"
    if task.problems:  # the engine refused the last answer of this attempt: say why
        refused = "\n- ".join(f"{p['pointer'] or '/'}: {p['message']}" for p in task.problems)
        user += f"\n\nYour last answer was refused:\n- {refused}"
    return [{"role": "system", "content": system}, {"role": "user", "content": user}]


class LlmHandler:
    """The SDK handler that answers every state of its agent types with the model."""

    def __init__(self, settings: Settings, client: Any = None) -> None:
        if not settings.llm_base_url:
            raise ValueError("FSM_LLM_BASE_URL is not set: the LLM agent needs an endpoint")
        if not (settings.llm_model or settings.llm_models):
            raise ValueError("set FSM_LLM_MODEL (or FSM_LLM_MODELS): the LLM agent needs a model")
        self.settings = settings
        if client is None:
            from openai import OpenAI

            client = OpenAI(
                base_url=settings.llm_base_url,
                api_key=settings.llm_api_key or "unused",
                max_retries=0,  # retried here, within the state's deadline
            )
        self.client = client

    def model_for(self, task: Task, agent_type: str) -> str:
        models = self.settings.llm_models
        found = models.get(f"{task.machine_type}.{task.state}") or models.get(agent_type)
        model = found or self.settings.llm_model
        if not model:
            raise ValueError(f"no model for {task.machine_type}.{task.state} ({agent_type})")
        return model

    def __call__(self, task: Task, agent_type: str) -> dict[str, Any]:
        """The state's output, with the usage of every call; Failed (carrying that usage:
        it counts against the machine's budget) when the model could not give one."""
        spent: list[Spent] = [Spent()]
        try:
            return self._answer(task, agent_type, spent)
        except Failed:
            raise
        except Exception as exc:
            usage = {"tokensUsed": spent[0].tokens, "cost": round(spent[0].cost, 6)}
            raise Failed(f"{type(exc).__name__}: {exc}", usage) from exc

    def _answer(self, task: Task, agent_type: str, spent: list[Spent]) -> dict[str, Any]:
        schema = contract_of(task)
        model = self.model_for(task, agent_type)
        price = self.settings.llm_prices.get(model)
        messages = messages_for(task, schema)
        problems: list[str] = []
        for turn in range(self.settings.llm_max_corrections + 1):
            task.progress(f"asking {model}" + (f" (correction {turn})" if turn else ""))
            response = self._complete(task, model, messages, schema)
            usage = getattr(response, "usage", None)
            if usage is not None:
                spent[0] = spent[0].plus(
                    usage.prompt_tokens or 0, usage.completion_tokens or 0, price
                )
            content = response.choices[0].message.content or ""
            try:
                output = json.loads(content)
            except ValueError as exc:
                problems = [f"/: the answer is not JSON ({exc})"]
            else:
                problems = problems_of(schema, output)
                if not problems:
                    return {**output, **_usage(spent[0])}
            messages += [
                {"role": "assistant", "content": content[:20_000]},
                {
                    "role": "user",
                    "content": "Your answer does not meet the contract:\n- "
                    + "\n- ".join(problems)
                    + "\nAnswer again with the corrected JSON object only.",
                },
            ]
        answers = self.settings.llm_max_corrections + 1
        raise Failed(
            f"{model} broke the contract in {answers} answer{'s' if answers > 1 else ''}; "
            f"last: {'; '.join(problems)[:500]}",
            _usage(spent[0]),
        )

    def _complete(
        self, task: Task, model: str, messages: list[dict[str, str]], schema: Mapping[str, Any]
    ) -> Any:
        """One chat completion, tried again on 429 and 5xx until the deadline."""
        from openai import APIConnectionError, APIStatusError, APITimeoutError

        delay = FIRST_DELAY
        tries = 0
        while True:
            left = _seconds_left(task) - MARGIN_SECONDS
            if left <= 0:
                raise TimeoutError(f"the deadline of {task.state} passed waiting for {model}")
            try:
                with model_call(model) as answered:  # a span per completion, when traced
                    response = self.client.with_options(timeout=left).chat.completions.create(
                        model=model,
                        messages=messages,
                        response_format={
                            "type": "json_schema",
                            "json_schema": {"name": "state_output", "schema": dict(schema)},
                        },
                    )
                    answered(response)
                return response
            except (APIStatusError, APIConnectionError, APITimeoutError) as exc:
                status = getattr(exc, "status_code", None)
                if status is not None and status != 429 and status < 500:
                    raise  # the request itself is wrong: trying again changes nothing
                tries += 1
                if tries > self.settings.llm_max_retries:
                    raise
                wait = min(_retry_after(exc) or delay, LONGEST_DELAY)
                delay = min(delay * 2, LONGEST_DELAY)
                if wait >= _seconds_left(task) - MARGIN_SECONDS:
                    raise TimeoutError(
                        f"{model} asked to wait {wait:.0f}s, past the deadline of {task.state}"
                    ) from exc
                task.progress(f"{model} answered {status or 'nothing'}; again in {wait:.1f}s")
                if task.wait_cancelled(wait):
                    raise TimeoutError("the attempt was cancelled") from exc


def _usage(spent: Spent) -> dict[str, Any]:
    """What the ack reports the attempt spent."""
    return {"tokensUsed": spent.tokens, "cost": round(spent.cost, 6)}


def _seconds_left(task: Task) -> float:
    deadline = task.message.deadline
    if deadline.tzinfo is None:
        deadline = deadline.replace(tzinfo=UTC)
    return (deadline - datetime.now(UTC)).total_seconds()


def _retry_after(exc: Exception) -> float | None:
    """The server's Retry-After (seconds, or retry-after-ms), when it gave one."""
    response = getattr(exc, "response", None)
    headers = getattr(response, "headers", None) or {}
    try:
        if "retry-after-ms" in headers:
            return max(float(headers["retry-after-ms"]) / 1000, 0.0)
        if "retry-after" in headers:
            return max(float(headers["retry-after"]), 0.0)
    except ValueError:
        return None
    return None


def serve_llm(agent: Agent, handler: LlmHandler) -> None:
    """Have the SDK agent answer every state it is handed with the model."""
    agent_type = agent.agent_type

    @agent.handler(ANY, ANY)
    def answer(task: Task) -> dict[str, Any]:
        started = time.monotonic()
        try:
            return handler(task, agent_type)
        finally:
            log.info("%s %s took %.1fs", task.machine_type, task.state, time.monotonic() - started)
