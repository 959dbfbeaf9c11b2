"""docs/operations.md's "Traces" and the traceparent of docs/protocol.md hold for the code:
the protocol's schema block is the state_task's, its example task parses and names its
machine's trace, the shell block's environment turns traces on, and every span the pages
name is one the code makes."""

from __future__ import annotations

import json
import re
import shlex
from uuid import UUID

from fsm_celery.core.messages import StateTask, parse_task_message
from fsm_celery.traces import wanted
from fsm_celery.traces.ids import parse_traceparent
from tests.support import ROOT
from tests.support.docs import block_with


def test_the_protocol_s_traceparent_schema_is_the_state_task_s() -> None:
    documented = json.loads(block_with("protocol.md", "json", '"traceparent": {'))
    generated = StateTask.model_json_schema(by_alias=True)["properties"]["traceparent"]
    assert documented == {"traceparent": generated}


def test_the_protocol_s_traced_task_parses_and_names_its_machine_s_trace() -> None:
    task = parse_task_message(block_with("protocol.md", "json", '"traceparent": "00-'))
    assert isinstance(task, StateTask)
    parent = parse_traceparent(task.traceparent)
    assert parent is not None and UUID(int=parent.trace_id) == task.machine_id


def test_the_operations_shell_block_turns_traces_on() -> None:
    block = block_with("operations.md", "sh", "OTEL_")
    environ = {}
    for line in block.splitlines():
        words = shlex.split(line)
        if words and words[0] == "export":
            name, _, value = words[1].partition("=")
            environ[name] = value
    assert environ and wanted(environ)


def test_every_span_the_operations_table_names_is_made_by_the_code() -> None:
    text = (ROOT / "docs" / "operations.md").read_text().partition("## Traces")[2]
    rows = re.findall(r"^\| `([^`]+)`", text, re.MULTILINE)
    ours = [row for row in rows if "/fsm." not in row]  # not Celery's instrumentation's
    prefixes = {re.sub(r" [A-Z]+$", "", row) for row in ours}
    assert prefixes == {"machine", "state", "handle", "chat", "tools/call", "mcp agent task"}
    source = "\n".join(p.read_text() for p in (ROOT / "fsm_celery").rglob("*.py"))
    assert {p for p in prefixes if f'f"{p} {{' in source or f'"{p}"' in source} == prefixes
