"""Time travel: the context of a 1,000-step machine at any step, reconstructed from the changes its
history records (fsm_celery.core.timeline), and what those changes cost to store.

    .venv/bin/python -m bench.timetravel [--steps 1000] [--keys 20] [--reads 30]

One bench_loop machine is driven `--steps` transitions through the engine in this process (each
ack's output sets its step, one of `--keys` keys, and a 60-character note, so the context grows
to about `--keys` + 4 keys and every step changes three). Then, each `--reads` times after one
unmeasured read, p50, p99 (nearest rank) and max: `Client.context_at(id, step)` at the first,
the middle and the last step (the rows up to the step read, their changes folded into one
dict), and `Client.history(id, context=True)` (every row, with the context after each).
Storage: the average bytes PostgreSQL keeps of a row's `context_delta` and of its `output`
(pg_column_size), and what a snapshot of the whole context a row would take instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import redis
from sqlalchemy import text

from bench.common import REDIS_URL, deployment, tear_down, write_result
from fsm_celery.core.messages import task_stream
from fsm_celery.engine import Inbound


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def drive(env: Any, steps: int, keys: int) -> Any:
    """Start a bench_loop machine and ack `steps` of its state_tasks, in this process."""
    engine = env.client.engine
    [first] = engine.admin.start("bench_loop", {"goal": "time travel"}).next
    engine.entry.enter(first.machine_id, first.attempt)
    client = redis.Redis.from_url(REDIS_URL)
    stream = task_stream("bench", env.settings.channel_prefix)
    last = b"-"
    for step in range(steps):
        entries = client.xrange(stream, min=last if last == b"-" else b"(" + last)
        last = entries[-1][0]
        task = json.loads(entries[-1][1][b"message"])
        output = {"step": step, f"k{step % keys}": step, "note": f"step {step} " + "x" * 50}
        ack = {
            "type": "state_ack",
            "machineId": task["machineId"],
            "state": task["state"],
            "success": True,
            "output": output,
            "attempt": task["attempt"],
            "taskToken": task["taskToken"],
        }
        engine.inbox.apply([Inbound(json.dumps(ack), None)])  # inline (bench.common)
    return first.machine_id


def measure(steps: int, keys: int, reads: int) -> dict[str, Any]:
    env = deployment("timetravel")
    try:
        started = time.monotonic()
        mid = drive(env, steps, keys)
        drove = time.monotonic() - started
        env.client.history(mid, context=True)  # warm: the definition parsed, the pool open
        took = []
        for _ in range(reads):
            t0 = time.perf_counter()
            records = env.client.history(mid, context=True)
            took.append((time.perf_counter() - t0) * 1000)
        at: dict[str, dict[str, float]] = {}
        for step in (1, steps // 2, steps):
            one = []
            for _ in range(reads):
                t0 = time.perf_counter()
                env.client.context_at(mid, step)
                one.append((time.perf_counter() - t0) * 1000)
            at[str(step)] = {
                "p50": round(statistics.median(one), 2),
                "p99": round(_percentile(one, 0.99), 2),
                "max": round(max(one), 2),
            }
        with env.client.engine.db.connect() as conn:
            sizes = conn.execute(
                text(
                    "SELECT avg(pg_column_size(context_delta)), avg(pg_column_size(output)),"
                    " count(*) FROM state_transitions WHERE machine_id = :m"
                ),
                {"m": mid},
            ).one()
        final = records[-1].context or {}
        snapshot = len(json.dumps(final).encode())
        return {
            "steps": len(records) - 1,
            "context_keys": len(final),
            "drive_seconds": round(drove, 2),
            "context_at_step_ms": at,
            "history_with_contexts_ms": {
                "p50": round(statistics.median(took), 2),
                "p99": round(_percentile(took, 0.99), 2),
                "max": round(max(took), 2),
                "reads": reads,
            },
            "bytes_per_row": {
                "context_delta": round(float(sizes[0]), 1),
                "output": round(float(sizes[1] or 0), 1),
                "a_snapshot_instead": snapshot,
            },
        }
    finally:
        tear_down(env)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--keys", type=int, default=20)
    parser.add_argument("--reads", type=int, default=30)
    args = parser.parse_args()
    result = measure(args.steps, args.keys, args.reads)
    timed = result["history_with_contexts_ms"]
    stored = result["bytes_per_row"]
    print(
        f"{result['steps']} steps, {result['context_keys']} keys in the last context "
        f"(driven in {result['drive_seconds']} s)"
    )
    for step, one in result["context_at_step_ms"].items():
        print(
            f"the context at step {step}: p50 {one['p50']} ms, p99 {one['p99']} ms, "
            f"max {one['max']} ms"
        )
    print(
        f"the context at every step (history with contexts): p50 {timed['p50']} ms, "
        f"p99 {timed['p99']} ms, max {timed['max']} ms over {timed['reads']} reads"
    )
    print(
        f"stored a row: context_delta {stored['context_delta']} B, output {stored['output']} B; "
        f"a snapshot of the context instead: {stored['a_snapshot_instead']} B"
    )
    print(f"written {write_result('timetravel', result)}")


if __name__ == "__main__":
    main()
