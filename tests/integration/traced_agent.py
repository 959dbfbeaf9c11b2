"""An SDK agent for the traces' test (run by tests/integration/test_traces.py):

    python tests/integration/traced_agent.py AGENT_TYPE AGENT_ID

It answers every state at once, but the first attempt of each machine's TRY, which fails, so
that the state is retried. Traced as any SDK agent is, by the OTEL_* it is started with.
"""

from __future__ import annotations

import os
import sys
from typing import Any

from fsm_celery.agent.runner import run_agents
from fsm_celery.agent.sdk import Agent, Failed, Task


def build(agent_type: str, agent_id: str) -> Agent:
    agent = Agent(
        agent_type,
        redis_url=os.environ["FSM_REDIS_URL"],
        agent_id=agent_id,
        prefix=os.environ.get("FSM_CHANNEL_PREFIX", ""),
        concurrency=4,
        status_interval=1.0,
    )
    failed: set[str] = set()

    @agent.handler()
    def answer(task: Task) -> dict[str, Any]:
        if task.state == "TRY" and task.machine_id not in failed:
            failed.add(task.machine_id)
            raise Failed("the first try fails, to be retried")
        return {"done": task.state}

    return agent


if __name__ == "__main__":
    run_agents([build(sys.argv[1], sys.argv[2])])
