"""Waiting: many machines that wait (for an agent, an approval, an outside event) on one box, and
what they cost the rest: the scan, Redis, the processes' memory, the dashboard, new starts, and a
restart of every process.

    .venv/bin/python -m bench.waiting [--levels 10000 100000 1000000] [--seconds 30]
        [--starts 1000] [--requests 200] [--mode celery|inline]

Smoke run (a minute or two): --levels 2000 10000 --seconds 5 --starts 100 --requests 20.

The machines are of bench/definitions/bench_hold.yaml, a third each in its AGENT state (a
state_task in one of 100 agents' streams, read by the agent's consumer group and never answered),
its APPROVE gate (open, nobody decides) and its EVENT wait (no event comes). Each level is filled
up to its count through the real path: the machines are stored due (set-based SQL) and this
process runs the engine's scan (`Scan.run`, 500 a transaction, as beat's task does) until every
one is entered. Entering sets each deadline a day ahead; the bench then spreads the new ones'
deadlines (and their gates') uniformly over the next day with one UPDATE, as a deployment that
has run for a day has them, so that the scan times out about count / 86,400 machines a second
while it is measured. Then VACUUM ANALYZE, as autovacuum would have.

At each level (0 first: an empty database), with every process stopped while it fills:

1. Restart: every process started at once, as a host's reboot does (two workers of 16 threads
   logging warnings, beat beside the first, as README.md runs them; an ack bridge of 2
   processes; the dashboard); seconds until each serves, and until a machine started through
   the Python API is entered by the workers (its state_task in its agent's stream).
2. The scan, for --seconds: beat sends fsm.scan every second; each worker serves its Prometheus
   /metrics, and each scan's duration is read from its fsm_scan_duration_seconds (a poll that
   saw one more scan takes its sum's growth; p50, p99, max by nearest rank); the timeouts it
   applied a second (history rows).
3. Memory: Redis's used_memory per waiting machine (its growth over the empty level's, divided
   by the machines waiting), the workers' and the bridge's RSS (each process tree's).
4. The dashboard's reads, --requests each, in a row, over one keep-alive connection: the
   machine list's first page, filtered by status, by type and status, the count by status, the
   open approvals, the statistics, and the fleet's Prometheus /metrics; p50 and p99 ms.
5. Starts: --starts machines started one after another through the Python API
   (`client.start_machine`), per second, against the empty level's in the same run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import httpx
import psutil
from sqlalchemy import text

from bench.common import (
    RECORD_HELP,
    FsmEnv,
    deployment,
    last_history_id,
    record_current,
    tear_down,
    wait,
    write_result,
)
from bench.dashboard import measure, percentile, rss_mib
from fsm_celery.core.messages import task_stream
from tests.support.credentials import VIEWER_TOKEN

AGENTS = 100  # agents the waiting machines are pinned to, a stream each
SCAN_BATCH = 500  # as fsm_celery.worker.tasks.SCAN_BATCH
TYPE = "bench_hold"
WAITS = ("AGENT", "APPROVE", "EVENT")
READS = {
    "list": "/api/machines?limit=50",
    "list_running": "/api/machines?status=running&limit=50",
    "list_type_running": f"/api/machines?type={TYPE}&status=running&limit=50",
    "count_running": "/api/machines/count?status=running",
    "approvals": "/api/approvals",
    "stats": "/api/stats",
    "fleet_metrics": "/metrics",
}


# ---- filling ------------------------------------------------------------------------------


def fill(env: FsmEnv, agents: list[str], count: int) -> dict[str, float]:
    """Add count waiting machines (every process stopped): stored due, entered by the engine's
    scan, their deadlines spread over the next day, the agents' tasks read; seconds of each."""
    db = env.client.engine.db
    took: dict[str, float] = {}
    t0 = time.monotonic()
    with db.begin() as conn:
        since = conn.execute(text("SELECT clock_timestamp()")).scalar_one()
        conn.execute(
            text("""
            INSERT INTO state_machines (id, type, agent_type, current_state, context, status,
                definition_version, attempt, agent_id, agent_pinned, dispatch_due_at)
            SELECT gen_random_uuid(), :type, 'bench', (CAST(:waits AS text[]))[g % 3 + 1],
                '{}'::jsonb, 'running', 1, 1, (CAST(:agents AS uuid[]))[g % :n_agents + 1],
                true, now() - interval '1 hour'
            FROM generate_series(1, :n) g"""),
            {"n": count, "type": TYPE, "waits": list(WAITS), "agents": agents, "n_agents": AGENTS},
        )
    took["store_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    scan, entered = env.client.engine.scan, 0
    while True:  # the scan enters what is due, 500 a transaction, until nothing is
        handled = scan.run(SCAN_BATCH).handled
        entered += handled
        if handled < SCAN_BATCH:
            break
    took["enter_s"] = time.monotonic() - t0
    took["entered_per_s"] = entered / took["enter_s"]
    t0 = time.monotonic()
    with db.begin() as conn:  # those entered now, from a day ahead to anywhere in the day
        spread = """
            UPDATE state_machines SET deadline_at = now() + random() * interval '1 day'
            WHERE type = :type AND status = 'running' AND entered_at >= :since"""
        conn.execute(text(spread), {"type": TYPE, "since": since})
        conn.execute(
            text("""
            UPDATE approval_gates g SET deadline_at = m.deadline_at FROM state_machines m
            WHERE g.machine_id = m.id AND g.closed_at IS NULL AND g.deadline_at <> m.deadline_at
            """)
        )
    took["spread_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    for agent in agents:  # each agent's consumer group reads its tasks (pending, unanswered)
        stream = task_stream(agent, env.settings.channel_prefix)
        while env.redis.xreadgroup("agents", "asleep", {stream: ">"}, count=5000):
            pass
    took["read_s"] = time.monotonic() - t0
    t0 = time.monotonic()
    with db.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    took["vacuum_s"] = time.monotonic() - t0
    return {k: round(v, 1) for k, v in took.items()}


def waiting_count(env: FsmEnv) -> dict[str, int]:
    with env.client.engine.db.connect() as conn:
        rows = conn.execute(
            text("""
            SELECT current_state, count(*) FROM state_machines
            WHERE type = :type AND status = 'running' GROUP BY current_state"""),
            {"type": TYPE},
        )
        return {state: int(n) for state, n in rows}


# ---- processes ----------------------------------------------------------------------------


@dataclass
class Deployed:
    workers: list[psutil.Process] = field(default_factory=list)
    metrics_ports: list[int] = field(default_factory=list)
    bridge: psutil.Process | None = None
    dashboard: psutil.Process | None = None
    base: str = ""


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def start_all(env: FsmEnv, agents: list[str]) -> tuple[Deployed, dict[str, float]]:
    """Every process started at once; seconds until each serves, and until a machine started
    now is entered (its task in its agent's stream)."""
    found, took, t0 = Deployed(), {}, time.monotonic()
    settings = env.settings
    errors: list[BaseException] = []

    def timed(name: str, start: Callable[[], psutil.Process]) -> Callable[[], None]:
        def run() -> None:
            try:
                process = start()
                took[f"{name}_s"] = time.monotonic() - t0
                setattr(found, name, process)
            except BaseException as exc:  # raised below
                errors.append(exc)

        return run

    def dashboard() -> psutil.Process:
        proc, found.base = env.start_dashboard()
        return psutil.Process(proc.popen.pid)

    spawned = len(env.procs)
    threads = [
        threading.Thread(target=timed("bridge", lambda: pid(env.start_bridge(2)))),
        threading.Thread(target=timed("dashboard", dashboard)),
    ]
    for thread in threads:
        thread.start()
    wait(lambda: len(env.procs) >= spawned + 2, 30, "the bridge and dashboard to spawn")
    # The workers read env.settings when spawned: each its own metrics port, then put back.
    found.metrics_ports = [free_port(), free_port()]
    for n, port in enumerate(found.metrics_ports):
        env.settings = settings.model_copy(update={"metrics_port": port})
        proc = env.start_worker(beat=n == 0, concurrency=16, log_level="warning")
        found.workers.append(pid(proc))
        took[f"worker_{n}_s"] = time.monotonic() - t0
    env.settings = settings
    for thread in threads:
        thread.join()
    if errors:
        raise errors[0]
    stream = task_stream(agents[0], env.settings.channel_prefix)
    before = env.redis.xlen(stream)
    env.client.start_machine(TYPE, {}, agent_id=agents[0])
    wait(lambda: env.redis.xlen(stream) > before, 300, "a machine started after the restart")
    took["serving_s"] = time.monotonic() - t0
    return found, {k: round(v, 1) for k, v in took.items()}


def pid(proc: Any) -> psutil.Process:
    return psutil.Process(proc.popen.pid)


# ---- measuring ----------------------------------------------------------------------------

SCAN_SUM = re.compile(rb"^fsm_scan_duration_seconds_sum(?:\{[^}]*\})? (\S+)$", re.M)
SCAN_COUNT = re.compile(rb"^fsm_scan_duration_seconds_count(?:\{[^}]*\})? (\S+)$", re.M)


def scan_reading(http: httpx.Client, port: int) -> tuple[float, float]:
    body = http.get(f"http://127.0.0.1:{port}/metrics").content
    total = sum(float(m) for m in SCAN_SUM.findall(body))
    count = sum(float(m) for m in SCAN_COUNT.findall(body))
    return total, count


def scans(env: FsmEnv, ports: list[int], seconds: float) -> dict[str, Any]:
    """Each scan's duration, from the workers' own fsm_scan_duration_seconds, polled often
    enough that most polls saw at most one more scan; the timeouts applied a second."""
    durations: list[float] = []
    last_id = last_history_id(env)
    with httpx.Client(timeout=10) as http:
        last = {port: scan_reading(http, port) for port in ports}
        t0 = time.monotonic()
        while time.monotonic() - t0 < seconds:
            time.sleep(0.2)
            for port in ports:
                now = scan_reading(http, port)
                grew = now[1] - last[port][1]
                if grew:  # two scans between polls: each their mean (rare at a poll of 0.2 s)
                    durations += [(now[0] - last[port][0]) / grew * 1000] * int(grew)
                last[port] = now
        elapsed = time.monotonic() - t0
    with env.client.engine.db.connect() as conn:
        timeouts = conn.execute(
            text("SELECT count(*) FROM state_transitions WHERE id > :id AND event = 'timeout'"),
            {"id": last_id},
        ).scalar_one()
    ordered = sorted(durations)
    if not ordered:
        raise RuntimeError(f"no scan ran in {seconds} s: is beat running?")
    return {
        "scans": len(ordered),
        "p50_ms": round(percentile(ordered, 0.5), 2),
        "p99_ms": round(percentile(ordered, 0.99), 2),
        "max_ms": round(ordered[-1], 2),
        "timeouts_per_s": round(int(timeouts) / elapsed, 1),
    }


def memory(env: FsmEnv, deployed: Deployed) -> dict[str, float]:
    found = {f"worker_{n}_mib": round(rss_mib(p), 1) for n, p in enumerate(deployed.workers)}
    if deployed.bridge is not None:
        found["bridge_mib"] = round(rss_mib(deployed.bridge), 1)
    if deployed.dashboard is not None:
        found["dashboard_mib"] = round(rss_mib(deployed.dashboard), 1)
    found["redis_used_bytes"] = int(env.redis.info("memory")["used_memory"])
    return found


def reads(base: str, requests: int) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    with httpx.Client(base_url=base, headers=headers, timeout=120) as http:
        return {name: measure(http, path, requests, 120.0) for name, path in READS.items()}


def starts(env: FsmEnv, agents: list[str], count: int) -> dict[str, float]:
    times = []
    t0 = time.monotonic()
    for n in range(count):
        s = time.perf_counter()
        env.client.start_machine(TYPE, {}, agent_id=agents[n % len(agents)])
        times.append((time.perf_counter() - s) * 1000)
    elapsed = time.monotonic() - t0
    ordered = sorted(times)
    return {
        "per_s": round(count / elapsed, 1),
        "p50_ms": round(percentile(ordered, 0.5), 2),
        "p99_ms": round(percentile(ordered, 0.99), 2),
    }


def stop_all(env: FsmEnv) -> None:
    env.stop_all()
    env.procs.clear()


# ---- the run ------------------------------------------------------------------------------


def level(
    env: FsmEnv, agents: list[str], args: argparse.Namespace, empty_redis: int | None
) -> dict[str, Any]:
    deployed, restart = start_all(env, agents)
    try:
        time.sleep(2)  # the first scans and folds after the start
        result: dict[str, Any] = {"restart": restart}
        result["scan"] = scans(env, deployed.metrics_ports, args.seconds)
        result["memory"] = memory(env, deployed)
        waiting = sum(waiting_count(env).values())
        result["waiting"] = waiting
        if empty_redis is not None and waiting:
            grown = result["memory"]["redis_used_bytes"] - empty_redis
            result["redis_bytes_per_waiting"] = round(grown / waiting)
        result["reads"] = reads(deployed.base, args.requests)
        result["starts"] = starts(env, agents, args.starts)
        result["memory_after"] = memory(env, deployed)
        return result
    finally:
        stop_all(env)


def print_level(name: str, r: dict[str, Any]) -> None:
    s, m = r["scan"], r["memory"]
    print(
        f"{name:>9}: waiting {r['waiting']:>9,}  restart→serving {r['restart']['serving_s']:>5} s"
        f"  scan p50 {s['p50_ms']} p99 {s['p99_ms']} max {s['max_ms']} ms ({s['scans']} scans,"
        f" {s['timeouts_per_s']} timeouts/s)  starts {r['starts']['per_s']}/s"
    )
    rss = {k: v for k, v in m.items() if k.endswith("_mib")}
    print(f"{'':>11}memory {json.dumps(rss)} redis B/waiting {r.get('redis_bytes_per_waiting')}")
    reads_line = "  ".join(f"{k} {v['p50_ms']}/{v['p99_ms']}" for k, v in r["reads"].items())
    print(f"{'':>11}reads p50/p99 ms: {reads_line}")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--levels", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    parser.add_argument("--seconds", type=float, default=30.0, help="the scan's window a level")
    parser.add_argument("--starts", type=int, default=1000, help="machines started a level")
    parser.add_argument("--requests", type=int, default=200, help="requests per endpoint")
    parser.add_argument("--mode", choices=["inline", "celery"], default="celery")
    parser.add_argument("--record", metavar="CONDITIONS", help=RECORD_HELP)
    parser.add_argument(
        "--keep", action="store_true", help="keep the database afterwards (its URL is printed)"
    )
    args = parser.parse_args()
    levels = sorted(args.levels)
    env = deployment("waiting", transition_mode=args.mode, viewer_token=VIEWER_TOKEN)
    agents = [str(uuid.uuid4()) for _ in range(AGENTS)]
    for agent in agents:
        stream = task_stream(agent, env.settings.channel_prefix)
        env.redis.xgroup_create(stream, "agents", id="0", mkstream=True)
    started = time.time()
    results: dict[str, Any] = {"mode": args.mode, "levels": {}, "fills": {}}
    try:
        empty = level(env, agents, args, None)
        empty_redis = empty["memory"]["redis_used_bytes"]
        results["levels"]["0"] = empty
        print_level("empty", empty)
        have = sum(waiting_count(env).values())
        for target in levels:
            if target > have:
                results["fills"][str(target)] = fill(env, agents, target - have)
                print(f"filled to {target:,}: {json.dumps(results['fills'][str(target)])}")
            r = level(env, agents, args, empty_redis)
            base_starts = empty["starts"]["per_s"]
            r["starts"]["vs_empty"] = round(r["starts"]["per_s"] / base_starts, 2)
            results["levels"][str(target)] = r
            print_level(f"{target:,}", r)
            have = r["waiting"]
    finally:
        if args.keep:
            stop_all(env)
            print(f"kept {env.settings.database_url}")
        else:
            with contextlib.suppress(Exception):
                tear_down(env)
    results["elapsed_s"] = round(time.time() - started)
    print(f"written {write_result('waiting', results)}")
    p99 = [results["levels"][str(n)]["scan"]["p99_ms"] for n in levels]
    print(f"the scan's p99 by level {p99} ms")
    if args.record is not None:
        print(f"recorded {record_current('waiting', row(results, levels), args.record)}")


def row(results: dict[str, Any], levels: list[int]) -> dict[str, Any]:
    """The figures of the documents' waiting row: the largest level's, and the smallest's
    beside what should stay flat."""
    top, small = (results["levels"][str(levels[i])] for i in (-1, 0))
    return {
        "waiting": top["waiting"],
        "scan_p99_ms": top["scan"]["p99_ms"],
        "scan_p99_ms_smallest": small["scan"]["p99_ms"],
        "smallest": levels[0],
        "redis_bytes_per_waiting": top["redis_bytes_per_waiting"],
        "list_p99_ms": top["reads"]["list"]["p99_ms"],
        "stats_p99_ms": top["reads"]["stats"]["p99_ms"],
        "approvals_p99_ms": top["reads"]["approvals"]["p99_ms"],
        "starts_vs_empty": top["starts"]["vs_empty"],
        "restart_s": top["restart"]["serving_s"],
        "worker_mib": top["memory_after"]["worker_0_mib"],
        "worker_mib_smallest": small["memory_after"]["worker_0_mib"],
    }


if __name__ == "__main__":
    main()
