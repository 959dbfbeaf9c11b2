"""A mock agent that acks at once, in batches: reads up to 500 tasks per XREADGROUP and answers
them with one pipeline. Run by the benchmarks so that the agent is not what they measure.

    python bench/fast_agent.py AGENT_ID [RATE]

RATE (acks per second) paces it, for latency at a chosen load; each paced ack is sent on its
own. With FAST_AGENT_LOG set, it writes a line per task (T, with the time Redis stored it: the
stream entry id) and per ack sent (A): `T|A machine attempt unix-time`, so the latency benchmark
can pair an ack with the next task's publication, however long the task then waited here.
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
    log = open(os.environ.get("FAST_AGENT_LOG", os.devnull), "a", buffering=1 << 16)  # noqa: SIM115
    started, answered = time.monotonic(), 0
    while not stop:
        found = client.xreadgroup(GROUP, agent_id, {tasks: ">"}, count=500, block=200)
        if not found:
            continue
        pipe = client.pipeline(transaction=False)
        for entry_id, fields in found[0][1]:
            task = json.loads(fields[b"message"])
            stored = int(entry_id.split(b"-")[0]) / 1000  # Redis's clock, milliseconds
            log.write(f"T {task['machineId']} {task['attempt']} {stored:.3f}\n")
            ack = {
                "type": "state_ack",
                "machineId": task["machineId"],
                "state": task["state"],
                "attempt": task["attempt"],
                "taskToken": task["taskToken"],
                "success": True,
                "output": {},
            }
            if rate:
                time.sleep(max(0.0, started + answered / rate - time.monotonic()))
            pipe.xadd(acks, {"message": json.dumps(ack)})
            pipe.xack(tasks, GROUP, entry_id)
            pipe.xdel(tasks, entry_id)
            if rate:
                pipe.execute()
                log.write(f"A {task['machineId']} {task['attempt']} {time.time():.6f}\n")
            answered += 1
        if not rate:
            pipe.execute()
            sent = time.time()
            for _, fields in found[0][1]:
                task = json.loads(fields[b"message"])
                log.write(f"A {task['machineId']} {task['attempt']} {sent:.6f}\n")
    log.close()


if __name__ == "__main__":
    main()
