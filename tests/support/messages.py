"""The agents' side of the wire protocol, as test data: the outputs each state answers with,
how an agent replies to a state_task, and the acks and heartbeats built from one."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import TYPE_CHECKING, Any

from fsm_celery.agent.mock import OUTPUTS as MOCK_OUTPUTS
from fsm_celery.core.messages import task_stream

if TYPE_CHECKING:
    from tests.support.processes import FsmEnv

OUTPUTS: dict[str, dict[str, Any]] = {
    **MOCK_OUTPUTS,  # the shipped definitions' states
    "ONE": {"one": 1},
    "TWO": {"two": 2},
    "THREE": {"three": 3},
    "WAIT": {"answer": 42},
    "FALLBACK": {"fallback": True},
    "LONG": {"result": "done"},
    "FIRST": {"first": 1},
    "SECOND": {"second": 2},
}
FIX_BUG_STATES = [
    "ANALYZE_BUG",
    "LOCATE_CODE",
    "WRITE_FIX",
    "RUN_TESTS",
    "COMMIT_PUSH",
    "DEPLOY",
    "COMPLETE",
]


@dataclass(frozen=True)
class Reply:
    """How the agent answers one state_task: an ack (success, output), or silence."""

    success: bool = True
    output: dict[str, Any] | None = None  # None: the state's usual output
    silent: bool = False
    error: str | None = None
    heartbeat_for: float = 0.0  # send heartbeats this long first (every 0.3 s)


SILENT = Reply(silent=True)


def state_task_wire(
    deadline: datetime, machine_id: str | None = None, timeout_ms: int = 60_000
) -> str:
    """A state_task for test_linear's state ONE, as the engine sends one (a fixed token)."""
    return json.dumps(
        {
            "type": "state_task",
            "machineId": machine_id or str(uuid.uuid4()),
            "machineType": "test_linear",
            "state": "ONE",
            "attempt": 1,
            "context": {},
            "prompt": "do it",
            "requiredOutput": [],
            "timeout": timeout_ms,
            "deadline": deadline.isoformat(),
            "taskToken": "t" * 64,
        }
    )


def heartbeat_for(task: dict[str, Any], progress: str | None = None) -> dict[str, Any]:
    """A state_heartbeat for the task's attempt."""
    beat = {
        "type": "state_heartbeat",
        "machineId": task["machineId"],
        "state": task["state"],
        "attempt": task["attempt"],
        "taskToken": task["taskToken"],
    }
    return beat if progress is None else {**beat, "progress": progress}


def ack_for(task: dict[str, Any], reply: Reply = Reply()) -> dict[str, Any]:
    """The state_ack answering a state_task."""
    ack: dict[str, Any] = {
        "type": "state_ack",
        "machineId": task["machineId"],
        "state": task["state"],
        "success": reply.success,
        "output": OUTPUTS.get(task["state"], {}) if reply.output is None else reply.output,
        "attempt": task["attempt"],
        "taskToken": task["taskToken"],
    }
    if reply.error is not None:
        ack["error"] = reply.error
    return ack


def dispatches(env: FsmEnv, agent_id: str) -> dict[tuple[str, int], int]:
    """How many state_tasks the agent's stream holds for each (machine, attempt)."""
    stream = task_stream(agent_id, env.settings.channel_prefix)
    counts: dict[tuple[str, int], int] = {}
    for _, fields in env.redis.xrange(stream):
        task = json.loads(fields[b"message"])
        if task["type"] != "state_task":
            continue
        key = (task["machineId"], task["attempt"])
        counts[key] = counts.get(key, 0) + 1
    return counts
