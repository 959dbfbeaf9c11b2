"""Memory: worker and bridge RSS with 100,000 machines waiting in long states, and its drift over
a soak while the scan runs every second.

    .venv/bin/python -m bench.memory [--machines 100000] [--soak 600]

The machines are stored due for dispatch, so the worker's scan dispatches every one of them
(the real path: 500 per transaction) to an agent that never answers; they then wait on hour-long
deadlines. No task per waiting machine is held anywhere: the deadlines are in PostgreSQL.
"""

from __future__ import annotations

import argparse
import contextlib
import time
import uuid
from typing import Any

import psutil
from sqlalchemy import text

from bench.common import (
    RECORD_HELP,
    FsmEnv,
    deployment,
    record_current,
    store_machines,
    tear_down,
    wait,
    write_result,
)

PROCESSES = ("worker", "beat", "bridge")


def rss_mb(env: FsmEnv, name: str, kind: str = "rss") -> float:
    """Memory of the named processes and their children, in MiB: summed RSS (which counts the
    pages forked children share once per child), or PSS (which shares them out)."""
    total = 0
    for proc in env.procs:
        if proc.name == name and proc.popen.poll() is None:
            parent = psutil.Process(proc.popen.pid)
            for p in [parent, *parent.children(recursive=True)]:
                with contextlib.suppress(psutil.Error):  # it exited meanwhile
                    info = p.memory_full_info() if kind == "pss" else p.memory_info()
                    total += getattr(info, kind)
    return round(total / 2**20, 1)


def waiting(env: FsmEnv) -> int:
    with env.client.engine.db.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM state_machines WHERE status = 'running' "
                    "AND dispatch_due_at IS NULL"
                )
            ).scalar_one()
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machines", type=int, default=100_000)
    parser.add_argument("--soak", type=float, default=600.0, help="seconds")
    parser.add_argument("--record", metavar="CONDITIONS", help=RECORD_HELP)
    args = parser.parse_args()
    env = deployment("memory")
    try:
        env.start_worker(beat=False, concurrency=16)  # as in production: beat on its own
        env.start_beat()
        env.start_bridge(processes=2)
        idle = {name: rss_mb(env, name) for name in PROCESSES}
        store_machines(env, "bench_wait", "WAIT", args.machines, str(uuid.uuid4()))
        t0 = time.monotonic()
        wait(lambda: waiting(env) >= args.machines, 1800, "every machine dispatched")
        dispatched_s = time.monotonic() - t0
        samples: list[dict[str, Any]] = []
        end = time.monotonic() + args.soak
        while True:
            samples.append(
                {
                    "t": round(time.monotonic() - t0, 1),
                    **{name: rss_mb(env, name) for name in PROCESSES},
                    "worker_pss": rss_mb(env, "worker", "pss"),
                }
            )
            if time.monotonic() >= end:
                break
            time.sleep(min(10.0, max(end - time.monotonic(), 0.1)))
        first, last = samples[0], samples[-1]
        peak = max(s["worker"] for s in samples)
        print(
            f"\n{args.machines:,} machines dispatched in {dispatched_s:.1f}s "
            f"({args.machines / dispatched_s:.0f}/s), now waiting"
        )
        print(f"{'':>8} {'idle MiB':>9} {'waiting MiB':>12} {'after soak':>11} {'peak':>7}")
        for name in PROCESSES:
            print(
                f"{name:>8} {idle[name]:>9} {first[name]:>12} {last[name]:>11} "
                f"{max(s[name] for s in samples):>7}"
            )
        drift = last["worker"] - first["worker"]
        print(f"soak {args.soak:.0f}s: worker drift {drift:+.1f} MiB (peak {peak})")
        print(
            f"worker PSS (pages shared by the forked processes counted once): "
            f"{first['worker_pss']} -> {last['worker_pss']} MiB; the worker is a supervisor "
            "shell and its process (a pool of 16 threads, as celeryconfig.py sets it); the bridge "
            "2 processes"
        )
        path = write_result(
            "memory",
            {
                "machines": args.machines,
                "dispatch_s": dispatched_s,
                "idle_mb": idle,
                "samples": samples,
            },
        )
        print(f"written {path}")
        if args.record is not None:
            row = {
                "machines": args.machines,
                "worker_idle_mib": idle["worker"],
                "worker_waiting_mib": first["worker"],
                "worker_after_soak_mib": last["worker"],
                "worker_peak_mib": peak,
                "soak_s": args.soak,
                "beat_mib": last["beat"],
                "bridge_mib": last["bridge"],
                "dispatched_per_s": round(args.machines / dispatched_s),
            }
            print(f"recorded {record_current('memory', row, args.record)}")
    finally:
        tear_down(env)


if __name__ == "__main__":
    main()
