"""An SDK agent process for the fan-out fault tests (test_fanout_faults.py), run by them:

    python tests/integration/fan_agent.py AGENT_TYPE AGENT_ID

It answers every state_task at once with an output fixed by the task: `answer` names the
machine's type (which places a child in its parent: `test_fan_ten.FAN.b3`), the state and the
`n` and `item` of the context, so that a join's merged output can be computed beforehand,
however often an attempt timed out and was dispatched again. FAN_AGENT_THINK (seconds) is how
long each task takes, so that the faults find work in flight.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from fsm_celery.agent.runner import run_agents
from fsm_celery.agent.sdk import Agent, Task


def answer(machine_type: str, state: str, context: dict[str, Any]) -> str:
    """What the agent answers for a task (the test computes the merged outputs with it)."""
    return f"{machine_type}/{state}/{context.get('n')}/{context.get('item')}"


def build(agent_type: str, agent_id: str) -> Agent:
    agent = Agent(
        agent_type,
        redis_url=os.environ["FSM_REDIS_URL"],
        agent_id=agent_id,
        prefix=os.environ.get("FSM_CHANNEL_PREFIX", ""),
        concurrency=32,
        status_interval=1.0,
        shutdown_grace=1.0,
    )

    think = float(os.environ.get("FAN_AGENT_THINK", "0"))

    @agent.handler()
    def handle(task: Task) -> dict[str, Any]:
        time.sleep(think)
        return {"answer": answer(task.machine_type, task.state, dict(task.context))}

    return agent


if __name__ == "__main__":
    run_agents([build(sys.argv[1], sys.argv[2])])
