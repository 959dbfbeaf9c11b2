"""docs/definitions.md, the definition language's reference, generated from its models.

Each field's name, type and default come from the pydantic models (fsm_celery.core); its
meaning and example from MEANINGS, which tests/unit/test_definition_reference.py holds to the
models (a field without a meaning, or a meaning without a field, fails it). `make docs` writes it.
"""

from __future__ import annotations

from datetime import timedelta
from enum import Enum
from pathlib import Path
from typing import Any

from pydantic import BaseModel

from fsm_celery.core.definition import (
    Backoff,
    Branch,
    Edge,
    MachineDefinition,
    MapSpec,
    Notify,
    Parallel,
    StateDefinition,
)
from fsm_celery.core.gate import Approval
from fsm_celery.core.schedule import Schedule
from fsm_celery.core.signal import Wait
from fsm_celery.core.tool import ToolCall
from fsm_celery.core.usage import Budget

# (heading, model, key in YAML) in the order the reference shows them
SECTIONS: tuple[tuple[str, type[BaseModel], str], ...] = (
    ("A definition", MachineDefinition, "the file's top level"),
    ("A state", StateDefinition, "an item of `states`"),
    ("An edge", Edge, "`on_success`, `on_failure`, `on_approve`, `on_reject`, `on_event`"),
    ("Backoff", Backoff, "a state's `backoff`"),
    ("A map", MapSpec, "a state's `map`"),
    ("A parallel state", Parallel, "a state's `parallel`"),
    ("A branch", Branch, "an item of `parallel.branches`"),
    ("An approval", Approval, "a state's `approval`"),
    ("A wait", Wait, "a state's `wait`"),
    ("A tool call", ToolCall, "a state's `tool`"),
    ("A schedule", Schedule, "an item of `schedules`"),
    ("Notify", Notify, "the definition's `notify`"),
    ("A budget", Budget, "the definition's `budget`"),
)

MEANINGS: dict[str, tuple[str, str]] = {
    # MachineDefinition
    "MachineDefinition.type": ("The machine type's name: letters, digits, _.", "type: cto_fix_bug"),
    "MachineDefinition.agent_type": (
        "The agent type that works its states (a state may name another).",
        "agent_type: cto",
    ),
    "MachineDefinition.description": ("Shown by the CLI and dashboard.", "description: Fix a bug"),
    "MachineDefinition.initial_state": ("The state a machine starts in.", "initial_state: LOCATE"),
    "MachineDefinition.max_loops": (
        "How many times a machine may take edges marked `loop: true` before it goes to "
        "`on_loop_exhausted`.",
        "max_loops: 5",
    ),
    "MachineDefinition.budget": (
        "A bound on the tokens and cost a machine's agents report; past it the machine fails.",
        "budget: {tokens: 200000}",
    ),
    "MachineDefinition.on_loop_exhausted": (
        "The terminal state a machine goes to when a loop edge is past `max_loops`.",
        "on_loop_exhausted: FAILED",
    ),
    "MachineDefinition.states": ("Its states (at least one).", "states: [{name: DONE, ...}]"),
    "MachineDefinition.schedules": (
        "Beat starts a machine of the type on each (at most 20).",
        "schedules: [{cron: '0 * * * *'}]",
    ),
    "MachineDefinition.notify": (
        "Where to POST when a machine ends or waits for people (besides FSM_NOTIFY_URL).",
        "notify: {url: https://hooks.example.com/fsm}",
    ),
    "MachineDefinition.context_schema": (
        "The JSON Schema a starting context must match; prompts are checked against it.",
        "context_schema: {type: object, required: [repo]}",
    ),
    "MachineDefinition.agent_types": (
        "Per agent type, how much of its work may be in flight across all machines.",
        "agent_types: {researcher: {max_in_flight: 10}}",
    ),
    # StateDefinition
    "StateDefinition.name": ("The state's name, unique in its definition.", "name: WRITE_CODE"),
    "StateDefinition.description": ("Shown with the state.", "description: Write the fix"),
    "StateDefinition.prompt": (
        "A Jinja template over the context: what the agent is told.",
        "prompt: 'Fix {{ githubIssue }}'",
    ),
    "StateDefinition.required_output": (
        "Keys a successful answer must hold; they merge into the context.",
        "required_output: [branch]",
    ),
    "StateDefinition.output_schema": (
        "A JSON Schema (2020-12) a successful answer must match (`required_output` merged "
        "in); a broken answer goes back to the agent to correct; guards are checked "
        "against it.",
        "output_schema: {type: object, properties: {passed: {type: boolean}}}",
    ),
    "StateDefinition.max_corrections": (
        "How many refused answers an attempt may correct before the next is its failure "
        "(`invalid_output`; default: FSM_MAX_CORRECTIONS).",
        "max_corrections: 1",
    ),
    "StateDefinition.on_success": (
        "Where a success goes: edges tried in order, the last without a guard.",
        "on_success: REVIEW",
    ),
    "StateDefinition.on_failure": (
        "Where a failure goes once its retries are spent.",
        "on_failure: FAILED",
    ),
    "StateDefinition.timeout": (
        "How long an attempt (or a fan-out, or a wait) may take; an approval or a wait "
        "without one waits a day.",
        "timeout: 1h30m",
    ),
    "StateDefinition.heartbeat_timeout": (
        "How long an agent that sent a heartbeat may stay silent (default: `timeout`).",
        "heartbeat_timeout: 2m",
    ),
    "StateDefinition.max_duration": (
        "An attempt's limit however many heartbeats arrive (default: FSM_MAX_ATTEMPT_SECONDS).",
        "max_duration: 4h",
    ),
    "StateDefinition.max_retries": (
        "How many times a failed attempt is tried again before `on_failure`.",
        "max_retries: 2",
    ),
    "StateDefinition.retry_on": (
        "Which failures are retried: `failure` (success: false), `timeout`, `invalid_output`.",
        "retry_on: [timeout]",
    ),
    "StateDefinition.backoff": ("The wait before each retry.", "backoff: {delay: 10s}"),
    "StateDefinition.terminal": (
        "Makes the state an end: `completed` or `failed`.",
        "terminal: completed",
    ),
    "StateDefinition.agent_type": (
        "The agent type that works this state (default: the definition's).",
        "agent_type: reviewer",
    ),
    "StateDefinition.parallel": (
        "Named branches run as child machines, joined by a policy.",
        "parallel: {branches: [...]}",
    ),
    "StateDefinition.map": ("One child machine per element of a list.", "map: {items: ...}"),
    "StateDefinition.machine": (
        "One child machine of another definition's type.",
        "machine: cto_fix_bug",
    ),
    "StateDefinition.input": (
        "A `machine:` state's child input: JMESPath over {context}.",
        "input: '{repo: context.repo}'",
    ),
    "StateDefinition.output": (
        "What of a `machine:` child's final context comes back.",
        "output: [branch]",
    ),
    "StateDefinition.on_parent_cancel": (
        "What its children do when their parent is paused, resumed or cancelled.",
        "on_parent_cancel: abandon",
    ),
    "StateDefinition.approval": ("People decide the state.", "approval: {approvers: [release]}"),
    "StateDefinition.on_approve": ("Where an approval goes.", "on_approve: DEPLOY"),
    "StateDefinition.on_reject": ("Where a rejection goes.", "on_reject: FAILED"),
    "StateDefinition.on_timeout": (
        "An approval's or a wait's deadline: `approve`, `reject` or a state.",
        "on_timeout: ESCALATE",
    ),
    "StateDefinition.wait": ("An outside event decides the state.", "wait: {event: pr_merged}"),
    "StateDefinition.on_event": (
        "Where the event's payload leads (as output.*).",
        "on_event: DEPLOY",
    ),
    "StateDefinition.tool": (
        "A worker calls one tool of an MCP server (FSM_MCP_SERVERS); its result is the "
        "answer (docs/tools.md).",
        "tool: {server: ci, name: run_tests}",
    ),
    # Edge
    "Edge.target": ("The state it leads to.", "target: DEPLOY"),
    "Edge.when": (
        "A JMESPath guard over {output, context}; the edge is taken when it is truthy.",
        "when: output.passed",
    ),
    "Edge.loop": ("The edge goes back: it counts against `max_loops`.", "loop: true"),
    # Backoff
    "Backoff.delay": ("The first retry's wait.", "delay: 10s"),
    "Backoff.rate": ("Each next wait's multiplier.", "rate: 1.5"),
    "Backoff.max_delay": ("The longest wait.", "max_delay: 10m"),
    "Backoff.jitter": (
        "`full`: anywhere between 0 and the computed delay; `none`: exactly it.",
        "jitter: none",
    ),
}

_BODY = {
    "machine": ("Run a machine of this type instead of inline states.", "machine: cto_fix_bug"),
    "initial_state": ("The inline body's first state.", "initial_state: RESEARCH"),
    "states": ("The inline body's states, written as the top-level ones.", "states: [...]"),
    "agent_type": ("The body's agent type (default: the state's).", "agent_type: researcher"),
    "max_loops": ("The body's loop bound.", "max_loops: 1"),
    "on_loop_exhausted": ("The body's state past its loop bound.", "on_loop_exhausted: FAILED"),
    "input": (
        "What a child sees: JMESPath over {context, item, index}, or one per key.",
        "input: '{query: context.query}'",
    ),
    "output": ("Which fields of the child's final context it returns.", "output: [summary]"),
}
for _model in ("MapSpec", "Branch"):
    MEANINGS.update({f"{_model}.{field}": meaning for field, meaning in _BODY.items()})

MEANINGS.update(
    {
        "MapSpec.items": ("JMESPath over {context}: the list.", "items: context.subQuestions"),
        "MapSpec.item_key": ("The key a child's context holds its item under.", "item_key: q"),
        "MapSpec.max_concurrency": (
            "Children running at once; required unless the context_schema bounds the list.",
            "max_concurrency: 3",
        ),
        "MapSpec.tolerated_failures": (
            "Failed children the map survives: a count or a percentage.",
            "tolerated_failures: 20%",
        ),
        "MapSpec.result_key": (
            "The context key of the results, in item order (default: the state's name).",
            "result_key: findings",
        ),
        "Branch.name": ("The branch's name: its result's key in the context.", "name: tests"),
        "Parallel.branches": ("The branches (1 to 100).", "branches: [{name: a, ...}]"),
        "Parallel.join": (
            "`all`, `any`, or `{at_least: N}` successes.",
            "join: {at_least: 2}",
        ),
        "Parallel.tolerated_failures": (
            "With join: all, failed branches it survives.",
            "tolerated_failures: 1",
        ),
        "Approval.approvers": ("Groups of FSM_APPROVERS who decide.", "approvers: [release]"),
        "Approval.quorum": ("Approvals that open it: a number or `all`.", "quorum: 2"),
        "Approval.rejections": ("Rejections that close it.", "rejections: 2"),
        "Approval.form": (
            "`schema`: the JSON Schema of the decision's fields.",
            "schema: {type: object}",
        ),
        "ToolCall.server": (
            "The server's name in FSM_MCP_SERVERS (a command or a URL, per deployment).",
            "server: ci",
        ),
        "ToolCall.name": ("The tool's name on that server.", "name: run_tests"),
        "ToolCall.arguments": (
            "Its arguments; each string a template over the context (`{{ x }}` alone keeps x's "
            "type).",
            "arguments: {issue: '{{ githubIssue }}'}",
        ),
        "Wait.event": ("The event's name: lower case, digits, _.", "event: pr_merged"),
        "Wait.form": ("`schema`: the JSON Schema of the payload.", "schema: {type: object}"),
        "Schedule.name": ("Unique in the definition.", "name: hourly"),
        "Schedule.cron": ("Five fields, or six with seconds last.", "cron: '*/15 * * * *'"),
        "Schedule.timezone": ("An IANA name: ticks follow its daylight saving.", "timezone: UTC"),
        "Schedule.context": ("The machine's initial context.", "context: {region: eu}"),
        "Schedule.overlap": (
            "`skip`: none while the previous still runs; `allow`.",
            "overlap: allow",
        ),
        "Notify.url": ("Where to POST (http or https).", "url: https://hooks.example.com/fsm"),
        "Notify.on": ("Which events are sent.", "on: [completed, failed]"),
        "Budget.tokens": ("Most tokens a machine's agents may report.", "tokens: 200000"),
        "Budget.cost": ("Most cost a machine's agents may report.", "cost: 5.0"),
    }
)

INTRO = """\
# Definitions: the reference

<!-- Generated by `python -m fsm_celery.definition_reference` (make docs) from the models in
fsm_celery/core; tests/unit/test_definition_reference.py holds it to them. Do not edit. -->

A definition is a YAML file in `definitions/` (load it with `fsm-celery definitions load`;
check it with `fsm-celery definitions validate`). Every field, its default and an example
follow. A required field has no default. Booleans are YAML 1.2's `true` and `false`: `on`,
`off`, `yes` and `no` are text (notify's `on:` is a key), and a boolean field takes them too.

## Durations

`timeout`, `heartbeat_timeout`, `max_duration` and `backoff`'s `delay` and `max_delay` take
seconds (`300`), units `s`, `m`, `h`, `d`, alone or combined largest first (`30s`, `10m`, `4h`,
`2d`, `1h30m`, `2d 4h`), or ISO 8601 (`PT5M`). Each is at most 30 days.

## Retries, and what a child's failure costs a fan-out

An attempt fails when the agent answers `success: false` (`failure`), no answer comes before
its deadline (`timeout`), or a success breaks its contract (`invalid_output`: a
`required_output` key missing, or its `output_schema` unmet, once the agent has used its
`max_corrections`: until then each such answer goes back to the agent, as a `state_ack_refused`
naming each problem, and the attempt runs on). A failure whose kind is in the state's
`retry_on` (all three by default) is tried again, after its `backoff`, until `max_retries`
retries are spent (0 by default: no retry); then the machine follows `on_failure`. Inside a
fan-out the same holds for each child's states: a child's `success: false` is retried as its
state says, and only a child that ends `failed` counts against its map's or parallel state's
`tolerated_failures`.

```yaml
type: example_retries
agent_type: cto
initial_state: WORK
states:
  - name: WORK
    prompt: Do the work.
    timeout: 10m
    max_retries: 2                # up to 3 attempts
    retry_on: [timeout, invalid_output]   # a success: false goes to on_failure at once
    backoff: {delay: 30s, rate: 2, max_delay: 5m}
    on_success: DONE
    on_failure: FAILED
  - name: DONE
    terminal: completed
  - name: FAILED
    terminal: failed
```
"""


def shown(value: Any) -> str:
    """A default as a definition would write it."""
    if isinstance(value, timedelta):
        seconds = int(value.total_seconds())
        for unit, size in (("d", 86_400), ("h", 3_600), ("m", 60)):
            if seconds and seconds % size == 0:
                return f"`{seconds // size}{unit}`"
        return f"`{seconds}s`"
    if isinstance(value, Enum):
        return f"`{value.value}`"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, BaseModel):
        return "(its fields' defaults)"
    if isinstance(value, tuple | list):
        return f"`[{', '.join(str(shown(v)).strip('`') for v in value)}]`"
    if value in (None, {}, ""):
        return "(none)"
    return f"`{value}`"


def section(heading: str, model: type[BaseModel], where: str) -> list[str]:
    lines = [f"## {heading}", "", f"In {where}.", ""]
    lines += ["| Field | Default | Meaning | Example |", "| --- | --- | --- | --- |"]
    for name, info in model.model_fields.items():
        meaning, example = MEANINGS[f"{model.__name__}.{name}"]
        key = info.alias or name
        default = (
            "required" if info.is_required() else shown(info.get_default(call_default_factory=True))
        )
        lines.append(f"| `{key}` | {default} | {meaning} | `{example}` |")
    return [*lines, ""]


def definition_reference() -> str:
    """The whole of docs/definitions.md."""
    lines = [INTRO]
    for heading, model, where in SECTIONS:
        lines += section(heading, model, where)
    return "\n".join(lines).rstrip("\n") + "\n"


def write_reference(path: Path) -> bool:
    """Write the reference; whether it changed."""
    before = path.read_text(encoding="utf-8") if path.exists() else ""
    after = definition_reference()
    path.write_text(after, encoding="utf-8")
    return after != before


if __name__ == "__main__":  # make docs
    write_reference(Path(__file__).resolve().parent.parent / "docs" / "definitions.md")
