"""Fan-out: N children started at once and joined once, timed from the send to the join's next
step having run, with each process's memory; every contender measured in the same run.

    .venv/bin/python -m bench.fanout [--children 10000] [--runs 3]

The anchor is a Celery chord, `chord([noop.s()] * N)(done.s())` of bench/chord_app.py: no-op
header tasks on one prefork worker of 2 processes (Celery's defaults, one per core, as the
prefork chain of bench/throughput.py), on fsm-celery's broker and settings, joined by Celery's
Redis result backend (on FSM_BENCH_RESULT_URL, Redis database 14 unless told, flushed before and
after). Its time includes the publication of the N header messages by the sending process (send
s), as a fan-out's includes writing its children. Each run has a deployment and workers of its
own, and the runs of the contenders alternate, so that the machine's drift falls on each alike.
Each run of a map state is followed by a second map of as many children on the same processes,
not timed as the figure: the workers' and bridges' memory after it, beside their memory after
the first, says whether anything is kept per child.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any, cast

import redis

from bench.common import (
    RECORD_HELP,
    CpuMeter,
    deployment,
    plain_worker_argv,
    record_current,
    spawn_fast_agent,
    tear_down,
    wait,
    write_result,
)
from bench.memory import rss_mb
from bench.throughput import start_workers
from tests.support.processes import FsmEnv


def run_chord(
    children: int = 10_000, concurrency: int = 2, pool: str = "prefork"
) -> dict[str, Any]:
    """The anchor: a chord of `children` no-op tasks, from its send to its callback having run."""
    from celery import chord

    from bench.chord_app import RESULT_URL, _done, done, noop

    results = redis.Redis.from_url(RESULT_URL)
    results.flushdb()
    env = deployment("chord")
    try:
        ready = start_chord_worker(env, concurrency, pool)
        queue = env.settings.queue
        header = [noop.s().set(queue=queue) for _ in range(children)]
        key = f"bench:chord:{uuid.uuid4().hex}"
        idle = memory(env, ["chord-worker"])
        meter = CpuMeter.of(env, {"sender": [os.getpid()]})
        meter.start()
        t0 = time.time()
        chord(header)(done.s(key).set(queue=queue))
        send_s = time.time() - t0
        peak = wait_sampling(env, ["chord-worker"], lambda: bool(_done.exists(key)), "the join")
        cpu = meter.stop()
        forget_results(noop.backend)
        joined = json.loads(cast(bytes, _done.get(key)))  # set before the wait ended
        _done.delete(key, ready)
        if joined["parts"] != children:
            raise RuntimeError(f"the chord joined {joined['parts']} results of {children}")
        seconds = joined["at"] - t0
        return {
            "contender": "chord",
            "children": children,
            "workers": f"1 x {pool} -c {concurrency}",
            "seconds": round(seconds, 2),
            "send_s": round(send_s, 2),
            "children_per_s": round(children / seconds, 1),
            "idle_mib": idle,
            "peak_mib": peak,
            "after_mib": memory(env, ["chord-worker"]),
            "cpu_ms_per_child": {k: round(v * 1000 / children, 3) for k, v in cpu.items()},
        }
    finally:
        tear_down(env)
        results.flushdb()


def run_fanout(mode: str, children: int = 10_000, bridges: int = 2) -> dict[str, Any]:
    """Ours: a bench_map machine over `children` items (a thousand children at a time, each one
    working state answered at once by the fast agent), from its start to the parent completed
    by the join, in a transition mode; workers and bridges as README.md runs them."""
    env = deployment(f"fan_{mode}", transition_mode=mode)
    try:
        start_workers(env)
        env.start_bridge(processes=bridges)
        agent = spawn_fast_agent(env, str(uuid.uuid4()), agent_type="bench")  # the type's stream
        names = ["worker", "bridge"]
        idle = memory(env, names)
        meter = CpuMeter.of(env, {"agent": [agent.pid], "sender": [os.getpid()]})
        meter.start()
        t0 = time.time()
        parent = env.client.start_machine("bench_map", {"items": list(range(children))})
        send_s = time.time() - t0

        def joined() -> bool:
            return env.client.get_machine(parent).status != "running"

        peak = wait_sampling(env, names, joined, "the join")
        cpu = meter.stop()
        seconds = _joined_at(env, parent, children) - t0
        after = memory(env, names)
        # A second map of as many children on the same processes: what the first left grown
        # is the heap it used, kept; what grows again would be kept per child.
        t1 = time.time()
        again = env.client.start_machine("bench_map", {"items": list(range(children))})
        wait_sampling(
            env, names, lambda: env.client.get_machine(again).status != "running", "a second map"
        )
        again_s = _joined_at(env, again, children) - t1
        agent.terminate()
        return {
            "contender": mode,
            "children": children,
            "workers": "2 x threads -c 16, 2 bridges",
            "seconds": round(seconds, 2),
            "send_s": round(send_s, 2),
            "children_per_s": round(children / seconds, 1),
            "idle_mib": idle,
            "peak_mib": peak,
            "after_mib": after,
            "again_s": round(again_s, 2),
            "again_mib": memory(env, names),
            "cpu_ms_per_child": {k: round(v * 1000 / children, 3) for k, v in cpu.items()},
        }
    finally:
        tear_down(env)


def _joined_at(env: FsmEnv, parent: uuid.UUID, children: int) -> float:
    """When the map's parent was completed by its join (checked: every child's result there)."""
    info = env.client.get_machine(parent)
    if info.status != "completed" or len(info.context.get("EACH", [])) != children:
        raise RuntimeError(f"the map ended {info.status}: {info.error}")
    return info.updated_at.timestamp()


def forget_results(backend: Any) -> None:
    """Let the sender drop what Celery's Redis backend keeps of the chord it sent: a
    subscription to each header task's result channel (made as it sent the task), held by an
    AsyncResult per task that the backend keeps until its result is read, which a sender that
    never waits on them does not do. Each unsubscribes as it is collected: here, not while the
    interpreter exits, where it cannot."""
    backend._pending_results.concrete.clear()
    gc.collect()


def start_chord_worker(env: FsmEnv, concurrency: int, pool: str) -> str:
    """A `celery worker` of bench/chord_app.py, started and consuming; its readiness key."""
    from bench.chord_app import _done, ready_key

    argv = plain_worker_argv("bench.chord_app", env.settings.queue, concurrency, pool)
    worker = env._spawn("chord-worker", [*argv, "-n", "chord@%h"])

    ready = ready_key(worker.popen.pid)

    def started() -> bool:
        if worker.popen.poll() is not None:
            raise RuntimeError(f"the chord worker exited: see {worker.log}")
        return bool(_done.exists(ready))

    wait(started, 60, "the chord worker")
    return ready


def memory(env: FsmEnv, names: list[str]) -> dict[str, float]:
    """RSS in MiB of each named group of the deployment's processes, their children summed."""
    return {name: rss_mb(env, name) for name in names}


def wait_sampling(
    env: FsmEnv, names: list[str], joined: Callable[[], bool], what: str, timeout: float = 1800
) -> dict[str, float]:
    """Wait until joined() while sampling the named processes' memory; their peak RSS in MiB,
    a sample taken once joined() included."""
    peak = memory(env, names)
    deadline = time.monotonic() + timeout
    while True:
        over = joined()
        peak = {name: max(mib, peak[name]) for name, mib in memory(env, names).items()}
        if over:
            return peak
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        # The times are the database's and the chord's own (not this loop's): a sample 5 times
        # a second is enough for the peak, and takes less of the CPU the contenders share.
        time.sleep(0.2)


# What one run of the bench compares: a name and a run of N children, which returns the
# figures of run_chord (seconds from the send to the join's next step having run, send_s,
# children_per_s, and idle_mib, peak_mib, after_mib per process). The map state's runs join
# the chord here, one per transition mode; theirs add a second map on the same processes
# (again_s, and again_mib: memory after it, which is flat unless something is kept per child).
CONTENDERS: dict[str, Callable[[int], dict[str, Any]]] = {
    "chord": run_chord,
    "inline": partial(run_fanout, "inline"),
    "celery": partial(run_fanout, "celery"),
}


def summary(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """A contender's runs: the median time with its spread, and the highest peak memory."""
    seconds = [r["seconds"] for r in runs]
    median = statistics.median(seconds)
    names = runs[0]["peak_mib"]
    return {
        "runs": len(runs),
        "median_s": round(median, 2),
        "min_s": min(seconds),
        "max_s": max(seconds),
        "children_per_s": round(runs[0]["children"] / median, 1),
        "send_s": round(statistics.median(r["send_s"] for r in runs), 2),
        "peak_mib": {name: max(r["peak_mib"][name] for r in runs) for name in names},
    }


def highest(runs: list[dict[str, Any]], key: str) -> dict[str, float]:
    """Per process, the highest of the runs' figures under key (idle_mib, after_mib)."""
    return {process: max(r[key][process] for r in runs) for process in runs[0][key]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--children", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=1, help="runs of each contender")
    parser.add_argument("--record", metavar="CONDITIONS", help=RECORD_HELP)
    args = parser.parse_args()
    if args.children < 1 or args.runs < 1:
        parser.error("--children and --runs must be at least 1")
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in CONTENDERS}
    for _ in range(args.runs):
        for name, run in CONTENDERS.items():
            runs[name].append(run(args.children))
    summaries = {name: summary(of_name) for name, of_name in runs.items()}
    for name, of_name in runs.items():
        if name != "chord":
            grown = {
                process: (highest(of_name, "after_mib")[process], mib)
                for process, mib in highest(of_name, "again_mib").items()
            }
            shown = "  ".join(f"{p} {a} -> {b}" for p, (a, b) in grown.items())
            print(f"{name}: MiB after the first map -> after a second: {shown}")
    print(f"\n{args.children:,} children, {args.runs} run(s) of each")
    print(
        f"{'':>8} {'median s':>9} {'min s':>7} {'max s':>7} {'children/s':>11} {'send s':>7}"
        "  peak RSS MiB"
    )
    for name, s in summaries.items():
        peaks = "  ".join(f"{process} {mib}" for process, mib in s["peak_mib"].items())
        print(
            f"{name:>8} {s['median_s']:>9} {s['min_s']:>7} {s['max_s']:>7} "
            f"{s['children_per_s']:>11} {s['send_s']:>7}  {peaks}"
        )
    path = write_result("fanout", {"children": args.children, "runs": runs, "summary": summaries})
    print(f"written {path}")
    if args.record is not None:
        chord = summaries["chord"]["median_s"]
        figures = {
            "children": args.children,
            "runs": args.runs,
            "seconds": {name: s["median_s"] for name, s in summaries.items()},
            "spread_s": {name: [s["min_s"], s["max_s"]] for name, s in summaries.items()},
            "x_chord": {
                name: round(chord / s["median_s"], 2)
                for name, s in summaries.items()
                if name != "chord"
            },
            "peak_mib": {name: s["peak_mib"] for name, s in summaries.items()},
            "idle_mib": {name: highest(of_name, "idle_mib") for name, of_name in runs.items()},
            "after_mib": {name: highest(of_name, "after_mib") for name, of_name in runs.items()},
            "again_mib": {
                name: highest(of_name, "again_mib")
                for name, of_name in runs.items()
                if name != "chord"
            },
        }
        print(f"recorded {record_current('fanout', figures, args.record)}")


if __name__ == "__main__":
    main()
