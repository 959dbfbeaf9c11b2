"""An agent process written with the SDK, the way a user writes one (run by the tests).

    python tests/integration/sdk_agent.py AGENT_TYPE AGENT_ID [MARKER]

Serves every shipped CTO definition and the test definitions. With MARKER, the first visit of
test_linear's ONE works for a minute (so a test can kill it mid-task) and leaves MARKER behind;
later visits answer at once.

With SDK_AGENT_HOLD=SECONDS, test_pair's FIRST holds its first attempt that long, sending
progress as it goes and ignoring any cancel (an `async def` handler with SDK_AGENT_ASYNC=1,
which a cancel interrupts), and writes what it did to the file SDK_AGENT_JOURNAL: "start",
"cancelled" or "returned", with the machine and the attempt. SDK_AGENT_GRACE sets the agent's
shutdown grace (5 s by default), SDK_AGENT_CONCURRENCY its concurrency (8), SDK_AGENT_DELAY how
long each answer takes (0 s).
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from pathlib import Path
from typing import Any

from fsm_celery.agent.mock import OUTPUTS
from fsm_celery.agent.pipeline import serve_pipeline
from fsm_celery.agent.runner import run_agents
from fsm_celery.agent.sdk import Agent, Task

EXTRA = {
    "ONE": {"one": 1},
    "TWO": {"two": 2},
    "THREE": {"three": 3},
    "FIRST": {"first": 1},
    "SECOND": {"second": 2},
}


def build(agent_type: str, agent_id: str, marker: Path | None) -> Agent:
    agent = Agent(
        agent_type,
        redis_url=os.environ["FSM_REDIS_URL"],
        agent_id=agent_id,
        prefix=os.environ.get("FSM_CHANNEL_PREFIX", ""),
        concurrency=int(os.environ.get("SDK_AGENT_CONCURRENCY", "8")),
        status_interval=1.0,
        shutdown_grace=float(os.environ.get("SDK_AGENT_GRACE", "5")),
    )

    @agent.handler()
    def answer(task: Task) -> dict[str, Any]:
        first_visit = marker is not None and not marker.exists()
        if task.machine_type == "test_linear" and task.state == "ONE" and first_visit:
            marker.write_text(task.machine_id)  # type: ignore[union-attr]
            time.sleep(60)  # long enough to be killed in the middle
        task.progress(f"working on {task.state}")
        time.sleep(float(os.environ.get("SDK_AGENT_DELAY", "0")))
        return {**OUTPUTS.get(task.state, {}), **EXTRA.get(task.state, {})}

    if "SDK_AGENT_HOLD" in os.environ:
        hold(agent, float(os.environ["SDK_AGENT_HOLD"]), Path(os.environ["SDK_AGENT_JOURNAL"]))
    serve_pipeline(agent)
    return agent


def hold(agent: Agent, seconds: float, journal: Path) -> None:
    """test_pair's FIRST holds its first attempt for `seconds`, journalled."""

    def note(task: Task, what: str) -> None:
        with journal.open("a") as out:
            out.write(f"{what} {task.machine_id} {task.attempt}\n")

    if os.environ.get("SDK_AGENT_ASYNC") == "1":

        @agent.handler("test_pair", "FIRST")
        async def held_async(task: Task) -> dict[str, Any]:
            if task.attempt == 1:
                note(task, "start")
                try:
                    for _ in range(int(seconds / 0.2)):
                        task.progress("holding")
                        await asyncio.sleep(0.2)
                except asyncio.CancelledError:
                    note(task, "cancelled")
                    raise
                note(task, "returned")
            return {"first": 1}

        return

    @agent.handler("test_pair", "FIRST")
    def held(task: Task) -> dict[str, Any]:
        if task.attempt == 1:
            note(task, "start")
            for _ in range(int(seconds / 0.2)):
                task.progress("holding")  # sent only while the attempt is still the agent's
                time.sleep(0.2)  # deliberately deaf to cancels: the SDK must not need it
            note(task, "returned")
        return {"first": 1}


if __name__ == "__main__":
    agent_type, agent_id = sys.argv[1], sys.argv[2]
    marker = Path(sys.argv[3]) if len(sys.argv) > 3 else None
    run_agents([build(agent_type, agent_id, marker)])
