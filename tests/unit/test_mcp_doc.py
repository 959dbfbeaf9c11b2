"""docs/mcp.md's JSON blocks are settings an MCP client takes, for the door as it is: each
parses, the stdio one runs a command the CLI has with settings that exist, the HTTP one names
the path and the port the command serves by default, and the tools the doc lists are each
identity's."""

from __future__ import annotations

import json
import re
from urllib.parse import urlsplit

from fsm_celery.cli import main
from fsm_celery.cli.mcp import TOKEN_ENV
from fsm_celery.client.identities import Known, Role
from fsm_celery.config import Settings
from fsm_celery.mcp.operator import tool_names
from fsm_celery.mcp.serve import PATH
from tests.support import ROOT

DOC = (ROOT / "docs" / "mcp.md").read_text()


def _servers() -> list[dict[str, object]]:
    blocks = re.findall(r"^```json\n(.*?)^```", DOC, re.M | re.S)
    assert len(blocks) == 2
    return [json.loads(block)["mcpServers"]["fsm-celery"] for block in blocks]


def test_the_stdio_settings_run_the_operator_command_with_real_settings() -> None:
    stdio, _ = _servers()
    assert stdio["command"] == "fsm-celery"
    group, command = stdio["args"]  # type: ignore[misc]
    assert main.commands[group].commands[command].name == "operator"  # type: ignore[attr-defined]
    env = set(stdio["env"])  # type: ignore[arg-type]
    named = {n.removeprefix("FSM_").lower() for n in env - {TOKEN_ENV}}
    assert TOKEN_ENV in env
    assert [n for n in sorted(named) if n not in Settings.model_fields] == []


def test_the_http_settings_name_the_default_port_and_path_with_a_bearer_token() -> None:
    _, http = _servers()
    url = urlsplit(str(http["url"]))
    operator = main.commands["mcp"].commands["operator"]  # type: ignore[attr-defined]
    port = next(p for p in operator.params if p.name == "port")
    assert (url.port, url.path) == (port.default, PATH)
    assert http["headers"]["Authorization"].startswith("Bearer ")  # type: ignore[index]


def test_the_tools_the_doc_lists_are_each_identitys() -> None:
    rows = dict(re.findall(r"^\| (a viewer's|an approver's|an admin's) \| (.*) \|$", DOC, re.M))
    listed = {who: set(re.findall(r"`(\w+)`", tools)) for who, tools in rows.items()}
    reads = set(tool_names(Known("v", Role.VIEWER)))
    assert listed["a viewer's"] == reads
    approver = Known("a", Role.VIEWER, "alice", frozenset({"release"}))
    assert reads | listed["an approver's"] == set(tool_names(approver))
    assert reads | listed["an admin's"] | {"approve", "reject"} == set(
        tool_names(Known("x", Role.ADMIN))
    )
