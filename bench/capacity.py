"""The capacity model's measurements (docs/scaling.md): one run each, on this machine.

    .venv/bin/python -m bench.capacity [--machines 1000] [--seconds 8] [--modes celery inline]
        [--waiting 10000]

1. bench.throughput's figure (machines looping through two states, an agent that answers at
   once) at 1 and 2 workers and 1 and 2 bridge processes, in both modes: transitions/s, CPU
   milliseconds per transition of every process (worker, bridge, PostgreSQL, Redis, agent) and
   PostgreSQL's WAL bytes per transition.
2. Redis's memory per waiting machine: machines stored due, their state entered (a state_task
   XADDed to the agent's stream), then read by the agent's consumer group (the entry pending
   until answered): used_memory before and after, per machine; and per stream entry alone.
"""

from __future__ import annotations

import argparse
import json
import time
import uuid
from typing import Any

from bench.common import deployment, store_machines, tear_down, wait, write_result
from bench.throughput import run_engine
from fsm_celery.core.messages import task_stream


def engine_grid(machines: int, seconds: float, modes: list[str]) -> list[dict[str, Any]]:
    found = []
    for mode in modes:
        for workers in (1, 2):
            for bridges in (1, 2):
                r = run_engine(
                    machines, seconds=seconds, mode=mode, workers=workers, bridges=bridges
                )
                r.update(workers=workers, bridges=bridges)
                cpu = r["cpu_ms_per_transition"]
                print(
                    f"{mode:6} workers {workers} bridges {bridges}: {r['sustained_per_s']:>8}/s "
                    f"cpu ms/transition {json.dumps(cpu)} WAL {r['wal_bytes_per_transition']} B"
                )
                found.append(r)
    return found


def redis_memory(waiting: int) -> dict[str, Any]:
    env = deployment("capacity_redis")
    try:
        redis = env.redis
        agent_id = str(uuid.uuid4())
        stream = task_stream(agent_id, env.settings.channel_prefix)
        redis.xgroup_create(stream, "agents", id="0", mkstream=True)
        before = int(redis.info("memory")["used_memory"])
        store_machines(env, "bench_wait", "WAIT", waiting, agent_id)
        scan = env.client.engine.scan
        wait(lambda: bool(scan.run(500).handled) and redis.xlen(stream) >= waiting, 600, "entries")
        while redis.xlen(stream) < waiting:
            scan.run(500)
        entered = int(redis.info("memory")["used_memory"])
        size = len(redis.xrange(stream, count=1)[0][1][b"message"])
        read = 0
        while read < waiting:
            got = redis.xreadgroup("agents", "agent", {stream: ">"}, count=1000)
            read += sum(len(entries) for _, entries in got or [])
        pending = int(redis.info("memory")["used_memory"])
        result = {
            "waiting": waiting,
            "state_task_bytes": size,
            "bytes_per_waiting_machine": round((entered - before) / waiting),
            "bytes_per_pending_entry": round((pending - entered) / waiting),
            "bytes_per_waiting_machine_read": round((pending - before) / waiting),
        }
        print(json.dumps(result))
        return result
    finally:
        tear_down(env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--modes", nargs="+", default=["celery", "inline"])
    parser.add_argument("--waiting", type=int, default=10_000)
    args = parser.parse_args()
    started = time.time()
    result = {
        "redis": redis_memory(args.waiting),
        "engine": engine_grid(args.machines, args.seconds, args.modes),
        "elapsed_s": round(time.time() - started),
    }
    print(f"written {write_result('capacity', result)}")


if __name__ == "__main__":
    main()
