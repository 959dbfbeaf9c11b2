"""An SDK agent process for test_linear machines (test_rabbitmq.py's agent SIGKILL), run as:

    python tests/integration/linear_agent.py AGENT_ID

It answers each state_task with the output its state requires (`one` for ONE, ...) after
LINEAR_AGENT_THINK seconds, so that a SIGKILL finds tasks in its hands.
"""

from __future__ import annotations

import os
import sys
import time
from typing import Any

from fsm_celery.agent.runner import run_agents
from fsm_celery.agent.sdk import Agent, Task


def build(agent_id: str) -> Agent:
    agent = Agent(
        "tester",
        redis_url=os.environ["FSM_REDIS_URL"],
        agent_id=agent_id,
        prefix=os.environ.get("FSM_CHANNEL_PREFIX", ""),
        concurrency=16,
        status_interval=1.0,
        shutdown_grace=1.0,
    )
    think = float(os.environ.get("LINEAR_AGENT_THINK", "0"))

    @agent.handler()
    def handle(task: Task) -> dict[str, Any]:
        time.sleep(think)
        return {task.state.lower(): 1}

    return agent


if __name__ == "__main__":
    run_agents([build(sys.argv[1])])
