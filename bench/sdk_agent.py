"""An SDK agent (fsm_celery.agent.Agent) of concurrency 1 that answers every task at once with
an empty output: bench.mcp's baseline for the MCP agent door, which is such an agent whose
handler waits for an MCP session instead.

    python bench/sdk_agent.py AGENT_TYPE LOG

It connects as the door does (FSM_REDIS_URL, the agent's own credentials). On SIGTERM it stops
and writes LOG: a line per task taken (T, when the handler is called) and per answer given (A,
when the handler returns), `T|A machine attempt seconds`, the seconds of CLOCK_MONOTONIC, the
clock the benchmark reads (time.monotonic(), the same for every process of the machine).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

from fsm_celery.agent.sdk import Agent, Task


def main() -> None:
    agent_type, log = sys.argv[1], Path(sys.argv[2])
    agent = Agent(agent_type, concurrency=1, shutdown_grace=0)
    lines: list[str] = []

    @agent.handler()
    def answer(task: Task) -> dict[str, Any]:
        machine, attempt = task.message.machine_id, task.message.attempt
        lines.append(f"T {machine} {attempt} {time.monotonic():.6f}")
        lines.append(f"A {machine} {attempt} {time.monotonic():.6f}")
        return {}

    agent.run()  # until SIGTERM
    log.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
