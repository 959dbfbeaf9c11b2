"""docs/agents.md's MCP settings for the agent door are the door as it is (each block parses,
runs a command the CLI has, with settings that exist, at the default port and path), and what
the door checks a submitted output with: the output contract and its problems."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime
from urllib.parse import urlsplit
from uuid import uuid4

from fsm_celery.cli import main
from fsm_celery.config import Settings
from fsm_celery.core.contract import MAX_PROBLEMS
from fsm_celery.core.messages import StateTask
from fsm_celery.mcp.agent import contract, password_of, problems
from fsm_celery.mcp.serve import PATH
from tests.support import ROOT

DOC = (ROOT / "docs" / "agents.md").read_text()


def _servers() -> list[dict[str, object]]:
    blocks = re.findall(r"^```json\n(.*?)^```", DOC, re.M | re.S)
    return [json.loads(block)["mcpServers"]["fsm-celery-agent"] for block in blocks]


def test_the_stdio_settings_run_the_agent_command_with_real_settings() -> None:
    stdio, _ = _servers()
    assert stdio["command"] == "fsm-celery"
    group, command, flag, _ = stdio["args"]  # type: ignore[misc]
    found = main.commands[group].commands[command]  # type: ignore[attr-defined]
    assert found.name == "agent"
    assert flag in {opt for p in found.params for opt in p.opts}
    named = {n.removeprefix("FSM_").lower() for n in stdio["env"]}  # type: ignore[attr-defined]
    assert [n for n in sorted(named) if n not in Settings.model_fields] == []


def test_the_http_settings_name_the_default_port_and_path_with_a_bearer_token() -> None:
    _, http = _servers()
    url = urlsplit(str(http["url"]))
    agent = main.commands["mcp"].commands["agent"]  # type: ignore[attr-defined]
    port = next(p for p in agent.params if p.name == "port")
    assert (url.port, url.path) == (port.default, PATH)
    assert http["headers"]["Authorization"].startswith("Bearer ")  # type: ignore[index]


def _task(required: list[str]) -> StateTask:
    return StateTask(
        machine_id=uuid4(),
        machine_type="cto_fix_bug",
        state="FIX",
        attempt=1,
        context={},
        prompt="",
        required_output=required,
        timeout=60_000,
        deadline=datetime.now(UTC),
        task_token="t",
    )


def test_the_contract_is_an_object_with_the_states_required_keys() -> None:
    assert contract(_task(["fixed", "prUrl"])) == {
        "type": "object",
        "required": ["fixed", "prUrl"],
    }


def test_a_matching_output_has_no_problems() -> None:
    assert problems(contract(_task(["fixed"])), {"fixed": True, "extra": 1}) == []


def test_problems_name_a_json_pointer_and_what_is_wrong() -> None:
    schema = {
        "type": "object",
        "required": ["fixed"],
        "properties": {"tests": {"type": "object", "properties": {"a/b": {"type": "boolean"}}}},
    }
    assert sorted(problems(schema, {"tests": {"a/b": "yes"}})) == [
        "/: 'fixed' is a required property",
        "/tests/a~1b: 'yes' is not of type 'boolean'",
    ]


def test_at_most_twenty_problems_come_back() -> None:
    required = [f"k{i}" for i in range(MAX_PROBLEMS + 5)]
    assert len(problems(contract(_task(required)), {})) == MAX_PROBLEMS


def test_the_bearer_token_is_the_redis_urls_password_unquoted() -> None:
    assert password_of("redis://fsm-agent-x:p%40ss@localhost:6379/0") == "p@ss"
    assert password_of("redis://localhost:6379/0") is None
