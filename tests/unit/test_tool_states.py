"""Tool states' pure parts: the arguments rendered from the context (one expression keeps its
value's type), a tool's result made the attempt's output, the tool's own output schema checked
when the state declares no contract, and a call to a server the deployment does not name."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from uuid import uuid4

import mcp_types as types
import pytest

from fsm_celery.config import Settings
from fsm_celery.core import tool
from fsm_celery.core.prompt import PromptError
from fsm_celery.engine.tools import Pending
from fsm_celery.worker.caller import Caller

CALL = tool.ToolCall(
    server="ci",
    name="run_tests",
    arguments={
        "issue": "{{ issue.number }}",
        "title": "fix #{{ issue.number }}",
        "labels": ["{{ labels }}", "bug"],
        "options": {"fast": True, "retries": "{{ retries }}"},
        "limit": 3,
    },
)
CONTEXT = {"issue": {"number": 740}, "labels": ["a", "b"], "retries": 2}


def pending(call: tool.ToolCall = CALL, *, declares_contract: bool = False) -> Pending:
    return Pending(
        machine_id=uuid4(),
        machine_type="t",
        state="RUN",
        attempt=1,
        call=call,
        arguments={},
        deadline=datetime.now(UTC) + timedelta(minutes=1),
        declares_contract=declares_contract,
    )


def test_one_expression_keeps_its_type_and_other_strings_are_rendered_as_text() -> None:
    assert tool.arguments(CALL, CONTEXT, 10_000) == {
        "issue": 740,
        "title": "fix #740",
        "labels": [["a", "b"], "bug"],
        "options": {"fast": True, "retries": 2},
        "limit": 3,
    }


def test_an_argument_the_context_cannot_fill_is_named() -> None:
    with pytest.raises(PromptError, match="argument issue"):
        tool.arguments(CALL, {"labels": [], "retries": 1}, 10_000)
    with pytest.raises(PromptError, match=r"argument options\.retries"):
        tool.arguments(CALL, {"issue": {"number": 1}, "labels": []}, 10_000)


def test_arguments_over_the_bound_are_refused() -> None:
    with pytest.raises(PromptError, match="over 100"):
        tool.arguments(CALL, {**CONTEXT, "labels": ["x" * 200]}, 100)


def test_a_sandboxed_expression_cannot_allocate_without_bound() -> None:
    huge = tool.ToolCall(server="ci", name="t", arguments={"x": "{{ 'a' * n }}"})
    with pytest.raises(PromptError):
        tool.arguments(huge, {"n": 10**9}, 10_000)


def test_a_result_becomes_structured_json_or_text_and_an_error_result_is_a_failure() -> None:
    assert tool.outcome({"passed": True}, ["ignored"], False).output == {"passed": True}
    assert tool.outcome(None, ['{"passed": false}'], False).output == {"passed": False}
    assert tool.outcome(None, ["all good", "twice"], False).output == {"text": "all good\ntwice"}
    failed = tool.outcome(None, ["boom"], True)
    assert not failed.success and failed.error == "the tool failed: boom"
    assert tool.actor(CALL) == "mcp:ci/run_tests"


def test_the_tools_own_output_schema_is_checked_when_the_state_declares_no_contract() -> None:
    caller = Caller(Settings(mcp_servers={"ci": {"url": "http://127.0.0.1:1/mcp"}}))
    schema = {"type": "object", "properties": {"passed": {"type": "boolean"}}}
    result = types.CallToolResult(content=[], structured_content={"passed": "yes"})
    broken = caller._outcome(pending(), result, schema)
    assert not broken.success and "own output schema" in (broken.error or "")
    assert "/passed" in (broken.error or "")
    # the state's contract, when it declares one, is the engine's to check: passed on as it is
    kept = caller._outcome(pending(declares_contract=True), result, schema)
    assert kept.success and kept.output == {"passed": "yes"}


def test_a_result_over_the_payload_bound_fails_the_attempt() -> None:
    caller = Caller(Settings(max_payload_bytes=1024, mcp_servers={}))
    text = types.TextContent(type="text", text="x" * 2000)
    found = caller._outcome(pending(), types.CallToolResult(content=[text]), None)
    assert not found.success and "FSM_MAX_PAYLOAD_BYTES" in (found.error or "")


def test_a_server_the_deployment_does_not_name_fails_the_call_naming_the_setting() -> None:
    caller = Caller(Settings(mcp_servers={"other": {"command": ["true"]}}))
    found = caller.call(pending())
    assert found is not None and not found.success
    assert found.error == "no MCP server 'ci' in FSM_MCP_SERVERS (known: other)"


def test_a_server_is_a_command_or_a_url() -> None:
    with pytest.raises(ValueError, match="one of them"):
        Settings(mcp_servers={"x": {"command": ["a"], "url": "http://h/mcp"}})
    with pytest.raises(ValueError, match="a url takes headers"):
        Settings(mcp_servers={"x": {"url": "http://h/mcp", "env": {"A": "b"}}})
