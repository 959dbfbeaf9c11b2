"""The Celery hop: how long a no-op task waits between its publication and its start, beside a
bare Redis list (LPUSH → BRPOP) between two processes, at a steady rate.

    .venv/bin/python -m bench.celery_hop [--rate 50] [--seconds 8]

Why the ack bridge applies acks itself instead of handing them to a Celery task: this hop alone,
on an idle machine, is slower than the whole transition transaction. The worker runs with the
project's celeryconfig (late acks, prefetch 4, task events) in each pool it might use.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import time
from typing import Any

import redis

from bench.common import REDIS_URL, ROOT, write_result

QUEUE = "bench-hop"
LATENCIES = "bench:hop:ms"


def _quantiles(samples: list[float]) -> dict[str, float]:
    q = statistics.quantiles(sorted(samples), n=100)
    return {"p50_ms": round(q[49], 2), "p95_ms": round(q[94], 2), "p99_ms": round(q[98], 2)}


def _paced(rate: float, seconds: float, send: Any) -> None:
    started = time.monotonic()
    for n in range(int(rate * seconds)):
        time.sleep(max(0.0, started + n / rate - time.monotonic()))
        send()


def celery_hop(pool: str, concurrency: int, rate: float, seconds: float) -> dict[str, Any]:
    """Publication to start of a no-op task, measured by the task itself."""
    client = redis.Redis.from_url(REDIS_URL)
    client.delete(QUEUE, LATENCIES)
    argv = [sys.executable, "-m", "celery", "-A", "bench.hop_app", "worker", "-Q", QUEUE]
    argv += ["-c", str(concurrency), "-P", pool, "-l", "warning", "--without-mingle"]
    env = {**os.environ, "FSM_REDIS_URL": REDIS_URL, "FSM_QUEUE": QUEUE}
    worker = subprocess.Popen(
        [*argv, "--without-gossip"], cwd=ROOT, env=env, start_new_session=True
    )
    try:
        from bench.hop_app import hop

        time.sleep(5)  # the worker comes up (it logs nothing at warning level)
        _paced(rate, seconds, lambda: hop.apply_async((time.time(),), queue=QUEUE))
        time.sleep(2)
        samples = [float(x) for x in client.lrange(LATENCIES, 0, -1)]
    finally:
        os.killpg(worker.pid, 15)
        worker.wait(30)
    return {
        "path": f"Celery, {pool} pool, {concurrency} proc",
        "tasks": len(samples),
        **_quantiles(samples),
    }


def _consume(url: str, queue: str, out: str) -> None:
    client = redis.Redis.from_url(url)
    latencies = []
    while True:
        _, value = client.brpop([queue])  # type: ignore[misc]
        if value == b"stop":
            break
        latencies.append(f"{(time.time() - float(value)) * 1000:.3f}")
    client.rpush(out, *latencies)


def redis_hop(rate: float, seconds: float) -> dict[str, Any]:
    """The same hop over a bare Redis list between two processes."""
    client = redis.Redis.from_url(REDIS_URL)
    queue, out = "bench:hop:raw", "bench:hop:raw:ms"
    client.delete(queue, out)
    consumer = multiprocessing.get_context("spawn").Process(
        target=_consume, args=(REDIS_URL, queue, out)
    )
    consumer.start()
    time.sleep(1)
    _paced(rate, seconds, lambda: client.lpush(queue, repr(time.time())))
    client.lpush(queue, "stop")
    consumer.join(30)
    samples = [float(x) for x in client.lrange(out, 0, -1)]
    return {"path": "Redis LPUSH → BRPOP", "tasks": len(samples), **_quantiles(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rate", type=float, default=50.0, help="tasks per second")
    parser.add_argument("--seconds", type=float, default=8.0)
    args = parser.parse_args()
    runs = [
        celery_hop("prefork", 2, args.rate, args.seconds),
        celery_hop("solo", 1, args.rate, args.seconds),
        redis_hop(args.rate, args.seconds),
    ]
    print(f"\npublication → start at {args.rate:.0f}/s")
    print(f"{'path':>26} {'tasks':>6} {'p50 ms':>7} {'p95 ms':>7} {'p99 ms':>7}")
    for r in runs:
        print(f"{r['path']:>26} {r['tasks']:>6} {r['p50_ms']:>7} {r['p95_ms']:>7} {r['p99_ms']:>7}")
    print(f"written {write_result('celery_hop', {'rate': args.rate, 'runs': runs})}")


if __name__ == "__main__":
    main()
