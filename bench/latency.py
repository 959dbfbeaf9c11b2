"""Latency: from an ack's publication to the next state_task's publication, at 25%, 50% and 90%
of the maximum throughput (measured first, in the same run).

    .venv/bin/python -m bench.latency [--machines 1000] [--seconds 20] [--bridges 2]
        [--modes celery inline] [--runs 3] [--record CONDITIONS]

The agent paces its acks to the target rate and logs when Redis stored each ack in the ack stream
and each task in the agent's stream (both from the entry ids, Redis's clock, in milliseconds);
the latency of a transition is the storing of attempt n+1 minus the storing of the ack of attempt
n. It covers the bridge's read, the transaction up to the dispatch (locks, decision, writes; the
commit follows the dispatch) and the dispatch, to a millisecond; in the celery mode also the
relay's linger, the fsm.apply_acks task and the fsm.enter_state task it enqueues. Acks sent in
the first and last half second of the window are left out: there the benchmark itself counts
history rows and reads every process's CPU time. Each mode runs --runs times (3), the modes
alternating; the figures recorded are the medians of the runs' percentiles (p50 … p99.9), with
the spread of p99.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

from bench.common import (
    RECORD_HELP,
    CpuMeter,
    FsmEnv,
    deployment,
    dispatched,
    record_current,
    spawn_fast_agent,
    store_machines,
    tear_down,
    transitions,
    wait,
    write_result,
)
from bench.throughput import run_engine, start_workers

# The samples are the acks of the window less its first and last half second: the benchmark's
# own bookkeeping at either end (counting history rows, reading every process's CPU time) is
# not part of the steady state it measures.
MARGIN_MS = 500


def pairs(log: Path, start_ms: int, end_ms: int) -> list[float]:
    """Milliseconds from each ack stored (within [start_ms, end_ms], Redis's clock) to the next
    task of the same machine stored."""
    acks: dict[tuple[str, int], int] = {}
    received: dict[tuple[str, int], int] = {}
    for line in log.read_text().splitlines():
        kind, machine, attempt, at = line.split()
        (acks if kind == "A" else received)[(machine, int(attempt))] = int(at)
    return [
        float(received[(m, a + 1)] - sent)
        for (m, a), sent in acks.items()
        if start_ms <= sent <= end_ms and (m, a + 1) in received
    ]


def redis_ms(env: FsmEnv) -> int:
    """Now, by Redis's clock (the one the stream entry ids use), in milliseconds."""
    seconds, micros = env.redis.time()
    return int(seconds) * 1000 + int(micros) // 1000


def measure(
    machines: int, rate: float, seconds: float, bridges: int = 2, mode: str = "celery"
) -> dict[str, Any]:
    env = deployment(f"lat{int(rate)}_{mode}", transition_mode=mode)
    try:
        start_workers(env)
        env.start_bridge(processes=bridges)
        agent_id = str(uuid.uuid4())
        log = Path(tempfile.mkstemp(suffix=".log")[1])
        store_machines(env, "bench_loop", "S0", machines, agent_id)
        dispatched(env, agent_id, machines)
        agent = spawn_fast_agent(env, agent_id, rate, log)
        warm = max(machines, int(rate * 3))  # three seconds at the target rate, at least
        wait(lambda: transitions(env) >= warm, 600, "warm-up")
        log.write_text("")  # measure the steady state only
        meter = CpuMeter.of(env, {"agent": [agent.pid]})
        meter.start()
        t0, n0 = time.monotonic(), transitions(env)
        start = redis_ms(env) + MARGIN_MS
        time.sleep(seconds)
        end = redis_ms(env) - MARGIN_MS
        done = transitions(env) - n0
        elapsed = time.monotonic() - t0
        cpu = meter.stop()
        agent.terminate()
        agent.wait(10)
        samples = sorted(pairs(log, start, end))
        q = statistics.quantiles(samples, n=1000) if len(samples) > 2 else [float("nan")] * 999
        return {
            "target_per_s": round(rate, 1),
            "achieved_per_s": round(done / elapsed, 1),
            "samples": len(samples),
            "p50_ms": round(q[499], 2),
            "p95_ms": round(q[949], 2),
            "p99_ms": round(q[989], 2),
            "p999_ms": round(q[998], 2),
            "max_ms": round(samples[-1], 2) if samples else None,
            "cpu_ms_per_transition": {k: round(v * 1000 / max(done, 1), 3) for k, v in cpu.items()},
        }
    finally:
        tear_down(env)


def row(mode: str, machines: int, runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The documents' latency row for a mode: at half the maximum, the median of the runs'
    percentiles, with the spread of p99."""
    half = [run["levels"]["50%"] for run in runs]

    def median(key: str) -> float:
        return round(statistics.median(r[key] for r in half), 2)

    return {
        "mode": mode,
        "machines": machines,
        "load": 0.5,
        "runs": len(runs),
        "max_per_s": round(statistics.median(run["max_per_s"] for run in runs), 1),
        "achieved_per_s": median("achieved_per_s"),
        "p50_ms": median("p50_ms"),
        "p95_ms": median("p95_ms"),
        "p99_ms": median("p99_ms"),
        "p999_ms": median("p999_ms"),
        "p99_spread_ms": [min(r["p99_ms"] for r in half), max(r["p99_ms"] for r in half)],
        "samples": sum(r["samples"] for r in half),
        "cpu_ms_per_transition": {
            name: round(statistics.median(r["cpu_ms_per_transition"][name] for r in half), 3)
            for name in half[0]["cpu_ms_per_transition"]
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--bridges", type=int, default=2, help="ack bridge processes")
    parser.add_argument("--levels", type=float, nargs="+", default=[0.25, 0.5, 0.9])
    parser.add_argument(
        "--modes", nargs="+", choices=["celery", "inline"], default=["celery", "inline"]
    )
    parser.add_argument("--runs", type=int, default=3, help="runs of each mode (the median)")
    parser.add_argument("--record", metavar="CONDITIONS", help=RECORD_HELP)
    args = parser.parse_args()
    if args.record is not None and 0.5 not in args.levels:
        parser.error("--record needs the level the documents quote: --levels ... 0.5")
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    results: dict[str, Any] = {mode: [] for mode in args.modes}
    for _ in range(args.runs):  # the modes alternate: the machine's drift falls on each alike
        for mode in args.modes:
            top = run_engine(args.machines, bridges=args.bridges, mode=mode)["sustained_per_s"]
            levels = {
                f"{int(share * 100)}%": measure(
                    args.machines, top * share, args.seconds, args.bridges, mode
                )
                for share in args.levels
            }
            results[mode].append({"max_per_s": top, "levels": levels})
    for mode, runs in results.items():
        print(f"\n{mode} mode at {args.machines} machines, {len(runs)} run(s)")
        print(
            f"{'run':>4} {'max/s':>8} {'load':>5} {'target/s':>9} {'achieved/s':>11} "
            f"{'p50 ms':>8} {'p95 ms':>8} {'p99 ms':>8} {'p99.9 ms':>9} {'samples':>8}"
        )
        for number, run in enumerate(runs, start=1):
            for load, r in run["levels"].items():
                print(
                    f"{number:>4} {run['max_per_s']:>8} {load:>5} {r['target_per_s']:>9} "
                    f"{r['achieved_per_s']:>11} {r['p50_ms']:>8} {r['p95_ms']:>8} "
                    f"{r['p99_ms']:>8} {r['p999_ms']:>9} {r['samples']:>8}"
                )
        if args.record is not None:
            path = record_current("latency", row(mode, args.machines, runs), args.record)
            print(f"recorded {path}")
    path = write_result("latency", {"machines": args.machines, "runs": results})
    print(f"written {path}")


if __name__ == "__main__":
    main()
