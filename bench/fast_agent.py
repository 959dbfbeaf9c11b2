"""A mock agent that acks at once, in batches: reads up to 500 tasks per XREADGROUP and answers
them with one pipeline. Run by the benchmarks so that the agent is not what they measure.

    python bench/fast_agent.py AGENT_ID [RATE]

RATE (acks per second) paces it, for latency at a chosen load: every millisecond it sends, in one
pipeline, the acks due by then. With FAST_AGENT_LOG set, it writes a line per task received (T)
and per ack sent (A), `T|A machine attempt milliseconds`, both times taken from Redis's clock
(the stream entry ids of the task and of the ack), so the latency benchmark pairs an ack with the
next task of its machine on one clock, however long that task then waited here.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections import deque
from typing import Any

import redis

from fsm_celery.core.messages import ack_stream, task_stream

GROUP = "agents"


def stored_ms(entry_id: bytes) -> int:
    """When Redis stored a stream entry, in milliseconds (the first part of its id)."""
    return int(entry_id.split(b"-")[0])


def ack_for(task: dict[str, Any]) -> str:
    return json.dumps(
        {
            "type": "state_ack",
            "machineId": task["machineId"],
            "state": task["state"],
            "attempt": task["attempt"],
            "taskToken": task["taskToken"],
            "success": True,
            "output": {},
        }
    )


def main() -> None:
    agent_id = sys.argv[1]
    rate = float(sys.argv[2]) if len(sys.argv) > 2 else 0.0
    prefix = os.environ.get("FSM_CHANNEL_PREFIX", "")
    client = redis.Redis.from_url(os.environ["FSM_REDIS_URL"])
    tasks, acks = task_stream(agent_id, prefix), ack_stream(prefix)
    with contextlib.suppress(redis.ResponseError):  # the group exists already
        client.xgroup_create(tasks, GROUP, id="0", mkstream=True)
    stop = False

    def finish(*_: object) -> None:
        nonlocal stop
        stop = True

    signal.signal(signal.SIGTERM, finish)
    log = open(os.environ.get("FAST_AGENT_LOG", os.devnull), "a", buffering=1 << 16)  # noqa: SIM115
    waiting: deque[tuple[bytes, dict[str, Any]]] = deque()
    started, answered = time.monotonic(), 0
    while not stop:
        found = client.xreadgroup(
            GROUP, agent_id, {tasks: ">"}, count=500, block=None if waiting else 200
        )
        for entry_id, fields in found[0][1] if found else []:
            task = json.loads(fields[b"message"])
            log.write(f"T {task['machineId']} {task['attempt']} {stored_ms(entry_id)}\n")
            waiting.append((entry_id, task))
        due = len(waiting)
        if rate:
            due = min(due, int((time.monotonic() - started) * rate) - answered)
            if due <= 0:
                time.sleep(0.001)
                continue
        if not due:
            continue
        pipe = client.pipeline(transaction=False)
        sent = [waiting.popleft() for _ in range(due)]
        for entry_id, task in sent:
            pipe.xadd(acks, {"message": ack_for(task)})
            pipe.xack(tasks, GROUP, entry_id)
            pipe.xdel(tasks, entry_id)
        replies = pipe.execute()
        for (_, task), ack_id in zip(sent, replies[::3], strict=True):
            log.write(f"A {task['machineId']} {task['attempt']} {stored_ms(ack_id)}\n")
        answered += due
        if rate and not waiting:  # no credit for time spent with nothing to answer
            answered = max(answered, int((time.monotonic() - started) * rate))
    log.close()


if __name__ == "__main__":
    main()
