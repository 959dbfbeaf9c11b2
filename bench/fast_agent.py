"""A mock agent that acks instantly, in batches: reads up to 500 tasks per XREADGROUP and answers
them with one pipeline. Run by the benchmarks so that the agent is not what they measure.

    python bench/fast_agent.py AGENT_ID [RATE]

RATE (acks per second, optional) paces it, for latency at a chosen load. Each ack is written
with the time it was sent, so the latency benchmark can pair it with the next state_task.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time

import redis

from fsm_celery.core.messages import ack_stream, task_stream

GROUP = "agents"


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
    sent_log = open(os.environ.get("FAST_AGENT_LOG", os.devnull), "a")  # noqa: SIM115
    started, answered = time.monotonic(), 0
    while not stop:
        found = client.xreadgroup(GROUP, agent_id, {tasks: ">"}, count=500, block=200)
        if not found:
            continue
        entries = found[0][1]
        pipe = client.pipeline(transaction=False)
        for entry_id, fields in entries:
            if rate:
                wait = started + answered / rate - time.monotonic()
                if wait > 0:
                    pipe.execute()
                    pipe = client.pipeline(transaction=False)
                    time.sleep(wait)
            task = json.loads(fields[b"message"])
            ack = {
                "type": "state_ack",
                "machineId": task["machineId"],
                "state": task["state"],
                "attempt": task["attempt"],
                "taskToken": task["taskToken"],
                "success": True,
                "output": {},
            }
            pipe.xadd(acks, {"message": json.dumps(ack)})
            pipe.xack(tasks, GROUP, entry_id)
            pipe.xdel(tasks, entry_id)
            sent_log.write(f"{task['machineId']} {task['attempt']} {time.time():.6f}\n")
            answered += 1
        pipe.execute()
    sent_log.close()


if __name__ == "__main__":
    main()
