"""Dashboard: the HTTP API's reads over a large database, and the live feed's cost to the engine,
through the real `fsm-celery dashboard` process (uvicorn, one process, on 127.0.0.1).

    .venv/bin/python -m bench.dashboard [--finished 100000] [--history 1000000] [--requests 200]
        [--unfolded-requests 20] [--clients 100] [--seconds 10] [--machines 1000] [--load 0.5]
        [--mode inline|celery] [--budget 120]

Smoke run (a minute or two): --finished 2000 --history 20000 --requests 30 --clients 10
--seconds 5 --machines 200.

1. Reads. The database is prefilled as bench/scale.py does (`fill`: finished bench_chain machines
   and their history, set-based SQL, then VACUUM ANALYZE), but not folded; nothing else runs (no
   beat, so nothing folds the statistics behind the benchmark's back), and one httpx client with
   keep-alive sends each request `--requests` times in a row (after 3 unmeasured ones): the first
   page of `GET /api/machines?limit=50`, the same filtered (`status=completed&type=bench_chain`),
   page 2 through the `next` cursor, `GET /api/machines/{id}` (a machine and its history rows), and
   `GET /api/stats` twice: first with nothing folded (its unfolded tail is the whole history, which
   `Stats.read` caps at 200,000 attempts: `as_of.complete` says whether it was all read),
   `--unfolded-requests` times as each takes long, then after folding everything as beat would have
   (bench.scale's `fold_all`). Latency is the client's: from sending the request to having read the
   whole body; p50 and p99 by nearest rank; requests/s is sequential (1 / mean). An endpoint stops
   early after `--budget` seconds (the table shows how many requests it got).

2. Live pages. The engine's maximum throughput at `--machines` machines is measured first with
   bench.throughput's run_engine, on the same prefill; then, in the dashboard's deployment (two
   workers of 16 threads with beat, a bridge of 2 processes, as bench.latency runs them), the
   agent of bench.latency (bench/fast_agent.py) is paced to `--load` of that maximum. Three
   windows of `--seconds` each, after a warm-up of three seconds' worth of transitions: without
   clients, with `--clients` server-sent-event clients on `GET /api/events` (each its own
   streaming connection, one asyncio loop on a thread of this process, counting the events), and
   without clients again (brackets any drift). Each client is a live list page: it asks, as the
   page's script does, for the 50 running machines it shows (a different 50 each) and for the
   starts of new machines; `--firehose` makes each take every event instead, as a tool would.
   Reported: the engine's transitions/s in each window and the loss with clients against the mean
   of the two without; the transition events each client received per second (min / median, and
   the median's share of the transitions it asked for) and the resyncs the clients were told (a
   page's queue of 1,000 overflowed and was dropped); the dashboard process's CPU (% of one core)
   and peak RSS, and this process's CPU (the clients run here: on a 2-core machine they take CPU
   from the engine too). The "postgres" and "redis" CPU in the JSON are every such process on the
   machine.

The default mode is inline, not the engine's default (celery): it is the higher rate, so the
harder case for the feed. --mode celery measures the other.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import os
import statistics
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlencode

import httpx
import psutil

from bench.common import (
    RECORD_HELP,
    CpuMeter,
    FsmEnv,
    deployment,
    dispatched,
    last_history_id,
    record_current,
    spawn_fast_agent,
    store_machines,
    tear_down,
    transitions,
    wait,
    write_result,
)
from bench.scale import fill, fold_all
from bench.throughput import run_engine, start_workers

VIEWER_TOKEN = "bench-dashboard-viewer-" + "0123456789abcdef" * 2  # as the settings demand
WARM_REQUESTS = 3
EVENT_NAMES = (b"transitions", b"hello", b"resync")
STATE_EVENT = b'"type":"state_event"'  # one per transition, in a `transitions` batch
PAGE = 50  # the machines a live list page shows, and follows


# ---- the dashboard process ----------------------------------------------------------------


def start_dashboard(env: FsmEnv) -> tuple[psutil.Process, str]:
    """The real `fsm-celery dashboard` (the deployment's settings, its tokens included), once it
    serves; one of env.procs, so tear_down stops it."""
    proc, base = env.start_dashboard()
    return psutil.Process(proc.popen.pid), base


def tree(process: psutil.Process) -> list[psutil.Process]:
    try:
        return [process, *process.children(recursive=True)]
    except psutil.Error:
        return []


def rss_mib(process: psutil.Process) -> float:
    total = 0
    for p in tree(process):
        with contextlib.suppress(psutil.Error):
            total += p.memory_info().rss
    return total / 2**20


# ---- 1. reads -----------------------------------------------------------------------------


def percentile(ordered: list[float], share: float) -> float:
    """Nearest rank."""
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def measure(http: httpx.Client, path: str, count: int, budget: float) -> dict[str, Any]:
    """count sequential GETs of path (fewer if they take over budget seconds)."""
    for _ in range(WARM_REQUESTS if count > 1 else 1):
        http.get(path).raise_for_status()
    times: list[float] = []
    size = 0
    started = time.perf_counter()
    while len(times) < count and time.perf_counter() - started < budget:
        t0 = time.perf_counter()
        response = http.get(path)
        times.append((time.perf_counter() - t0) * 1000)
        response.raise_for_status()
        size = len(response.content)
    ordered = sorted(times)
    return {
        "path": path,
        "requests": len(times),
        "p50_ms": round(percentile(ordered, 0.50), 2),
        "p99_ms": round(percentile(ordered, 0.99), 2),
        "max_ms": round(ordered[-1], 2),
        "per_s": round(len(times) / (sum(times) / 1000), 1),
        "bytes": size,
    }


def reads(env: FsmEnv, base: str, args: argparse.Namespace) -> dict[str, Any]:
    headers = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
    n, budget = args.requests, args.budget
    with httpx.Client(base_url=base, headers=headers, timeout=120) as http:
        first = http.get("/api/machines", params={"limit": 50}).raise_for_status().json()
        machine_id = first["items"][0]["id"]
        history = len(http.get(f"/api/machines/{machine_id}").raise_for_status().json()["history"])
        cursor = first["next"]
        runs = {
            "list": measure(http, "/api/machines?limit=50", n, budget),
            "list_filtered": measure(
                http, "/api/machines?status=completed&type=bench_chain&limit=50", n, budget
            ),
            "list_page_2": measure(http, f"/api/machines?limit=50&cursor={cursor}", n, budget),
            "machine": measure(http, f"/api/machines/{machine_id}", n, budget),
        }
        unfolded_as_of = http.get("/api/stats").raise_for_status().json()["as_of"]
        runs["stats_unfolded"] = measure(http, "/api/stats", args.unfolded_requests, budget)
        fold = fold_all(env)
        folded_as_of = http.get("/api/stats").raise_for_status().json()["as_of"]
        runs["stats_folded"] = measure(http, "/api/stats", n, budget)
    return {
        "endpoints": runs,
        "machine_history_rows": history,
        "stats_as_of": {"unfolded": unfolded_as_of, "folded": folded_as_of},
        "fold": fold,
    }


# ---- 2. live pages ------------------------------------------------------------------------


@dataclass
class Feed:
    """clients server-sent-event clients of /api/events, on an asyncio loop of their own thread,
    counting the events each receives by name."""

    base: str
    clients: int
    queries: list[str] = field(default_factory=list)  # each client's /api/events query
    followed: int = 0  # machines each client follows (a page's)
    machines: int = 1  # machines running in all
    counts: list[dict[bytes, int]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    _loop: asyncio.AbstractEventLoop | None = None
    _stop: asyncio.Event | None = None
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self.counts = [dict.fromkeys((*EVENT_NAMES, STATE_EVENT), 0) for _ in range(self.clients)]
        self._thread = threading.Thread(target=asyncio.run, args=(self._main(),), daemon=True)
        self._thread.start()

    def connected(self) -> int:
        return sum(1 for c in self.counts if c[b"hello"])

    def snapshot(self, name: bytes = STATE_EVENT) -> list[int]:
        return [c[name] for c in self.counts]

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(30)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        limits = httpx.Limits(max_connections=self.clients + 5, max_keepalive_connections=0)
        timeout = httpx.Timeout(30.0)  # the server pings every 15 s
        headers = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
        async with httpx.AsyncClient(
            base_url=self.base, headers=headers, limits=limits, timeout=timeout
        ) as http:
            tasks = [asyncio.create_task(self._client(http, n)) for n in range(self.clients)]
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _client(self, http: httpx.AsyncClient, n: int) -> None:
        counts, rest = self.counts[n], b""
        try:
            query = self.queries[n] if self.queries else ""
            async with http.stream("GET", f"/api/events?{query}") as response:
                response.raise_for_status()
                async for chunk in response.aiter_raw():
                    data = rest + chunk
                    cut = data.rfind(b"\n") + 1  # count whole lines only
                    lines, rest = data[:cut], data[cut:][-65536:]
                    for name in EVENT_NAMES:
                        counts[name] += lines.count(b"event: " + name)
                    counts[STATE_EVENT] += lines.count(STATE_EVENT)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            self.errors.append(f"client {n}: {type(exc).__name__}: {exc}")


def running_ids(env: FsmEnv) -> list[str]:
    with env.client.engine.db.connect() as conn:
        rows = conn.exec_driver_sql(
            "SELECT id FROM state_machines WHERE status = 'running' ORDER BY id"
        ).all()
    return [str(row.id) for row in rows]


def page_query(ids: list[str], n: int) -> str:
    """What the list page's script asks for: the machines it shows and the starts of new ones."""
    start = (n * PAGE) % max(len(ids), 1)
    shown = (ids[start:] + ids[:start])[:PAGE]
    return urlencode([("starts", "true"), *(("machine_id", i) for i in shown)])


def connect(feed: Feed, timeout: float = 60.0) -> None:
    """Wait until every client has its hello, or one failed, or timeout seconds passed (the
    window then reports how many were connected)."""
    deadline = time.monotonic() + timeout
    while feed.connected() < feed.clients and not feed.errors and time.monotonic() < deadline:
        time.sleep(0.1)


def window(
    env: FsmEnv,
    seconds: float,
    dashboard: psutil.Process,
    agent_pid: int,
    feed: Feed | None = None,
) -> dict[str, Any]:
    """The engine's transitions/s over seconds, with every process's CPU and the dashboard's
    peak RSS; with a feed, the events each of its clients received meanwhile."""
    meter = CpuMeter.of(env, {"agent": [agent_pid], "bench (clients)": [os.getpid()]})
    meter.start()
    names = (*EVENT_NAMES, STATE_EVENT)
    before = {name: feed.snapshot(name) for name in names} if feed else {}
    mark = last_history_id(env)
    t0 = time.monotonic()
    peak_rss, deadline = 0.0, t0 + seconds
    while (now := time.monotonic()) < deadline:
        peak_rss = max(peak_rss, rss_mib(dashboard))
        time.sleep(min(0.5, deadline - now))
    done = transitions(env, mark)
    elapsed = time.monotonic() - t0
    after = {name: feed.snapshot(name) for name in names} if feed else {}
    cpu = meter.stop()
    result: dict[str, Any] = {
        "seconds": round(elapsed, 2),
        "transitions": done,
        "per_s": round(done / elapsed, 1),
        "cpu_pct_of_a_core": {k: round(v * 100 / elapsed, 1) for k, v in sorted(cpu.items())},
        "dashboard_cpu_pct": round(cpu.get("dashboard", 0.0) * 100 / elapsed, 1),
        "dashboard_peak_rss_mib": round(peak_rss, 1),
    }
    if feed is not None:
        rates = sorted(
            (a - b) / elapsed for a, b in zip(after[STATE_EVENT], before[STATE_EVENT], strict=True)
        )
        # a page receives the transitions of the machines it follows; the firehose, all of them
        expected = done / elapsed * (feed.followed / feed.machines if feed.queries else 1)
        resyncs = [a - b for a, b in zip(after[b"resync"], before[b"resync"], strict=True)]
        result |= {
            "clients": feed.clients,
            "connected": feed.connected(),
            "events_per_client_per_s": {
                "min": round(rates[0], 1),
                "median": round(statistics.median(rates), 1),
                "max": round(rates[-1], 1),
            },
            # the share of the transitions it asked for that the median client received
            "delivered_pct": round(statistics.median(rates) * 100 / max(expected, 1e-9), 1),
            "resyncs": {"total": sum(resyncs), "clients_resynced": sum(1 for r in resyncs if r)},
            "client_errors": feed.errors[:10],
        }
    return result


def live(
    env: FsmEnv, base: str, dashboard: psutil.Process, top: float, args: argparse.Namespace
) -> dict[str, Any]:
    rate = top * args.load
    start_workers(env)
    env.start_bridge(processes=2)
    agent_id = str(uuid.uuid4())
    store_machines(env, "bench_loop", "S0", args.machines, agent_id)
    dispatched(env, agent_id, args.machines)
    mark = last_history_id(env)
    agent = spawn_fast_agent(env, agent_id, rate)
    try:
        warm = max(args.machines, int(rate * 3))  # three seconds at the target rate, at least
        wait(lambda: transitions(env, mark) >= warm, 600, "warm-up")
        without = window(env, args.seconds, dashboard, agent.pid)
        feed = Feed(base, args.clients)
        if not args.firehose:  # each client a list page: PAGE running machines, and new ones
            ids = running_ids(env)
            feed.followed, feed.machines = min(PAGE, len(ids)), len(ids)
            feed.queries = [page_query(ids, n) for n in range(args.clients)]
        feed.start()
        try:
            connect(feed)
            time.sleep(1.0)  # every page past its first burst
            with_clients = window(env, args.seconds, dashboard, agent.pid, feed)
        finally:
            feed.stop()
        time.sleep(1.0)
        without_after = window(env, args.seconds, dashboard, agent.pid)
    finally:
        agent.terminate()
        agent.wait(10)
    reference = (without["per_s"] + without_after["per_s"]) / 2
    return {
        "max_per_s": top,
        "load": args.load,
        "target_per_s": round(rate, 1),
        "without": without,
        "with_clients": with_clients,
        "without_after": without_after,
        "loss_pct": round((1 - with_clients["per_s"] / reference) * 100, 1),
    }


# ---- the table ----------------------------------------------------------------------------

LABELS = {
    "list": "GET /api/machines?limit=50",
    "list_filtered": "  ?status=completed&type=bench_chain",
    "list_page_2": "  page 2 (cursor)",
    "machine": "GET /api/machines/{id}",
    "stats_unfolded": "GET /api/stats, nothing folded",
    "stats_folded": "GET /api/stats, folded",
}


def print_table(result: dict[str, Any]) -> None:
    r, lv = result["reads"], result["live"]
    print(
        f"\n{result['finished']:,} finished machines, {result['history']:,} history rows; "
        f"{result['mode']} mode"
    )
    print(f"{'endpoint':<38} {'requests':>8} {'p50 ms':>9} {'p99 ms':>9} {'req/s':>8} {'bytes':>8}")
    for key, label in LABELS.items():
        e = r["endpoints"][key]
        print(
            f"{label:<38} {e['requests']:>8} {e['p50_ms']:>9} {e['p99_ms']:>9} "
            f"{e['per_s']:>8} {e['bytes']:>8}"
        )
    un, fo, fold = r["stats_as_of"]["unfolded"], r["stats_as_of"]["folded"], r["fold"]
    print(
        f"stats as_of, nothing folded: unfolded {un['unfolded']:,}, complete {un['complete']}; "
        f"folded: unfolded {fo['unfolded']:,}, complete {fo['complete']} "
        f"(fold: {fold['attempts']:,} attempts, {fold['calls']} calls, {fold['seconds']} s); "
        f"dashboard RSS after the reads {r['dashboard_rss_after_reads_mib']} MiB"
    )
    print(
        f"\nlive feed: maximum {lv['max_per_s']}/s, paced to {lv['load']:.0%} = "
        f"{lv['target_per_s']}/s; {result['clients']} SSE clients; {result['seconds']} s windows"
    )
    print(
        f"{'window':<22} {'engine/s':>9} {'dash CPU %':>11} {'dash RSS MiB':>13} "
        f"{'bench CPU %':>12} {'events/client/s min / median':>29} {'delivered':>10} "
        f"{'resyncs':>8}"
    )
    for key, label in (
        ("without", "without clients"),
        ("with_clients", f"with {result['clients']} clients"),
        ("without_after", "without clients again"),
    ):
        w = lv[key]
        bench_cpu = w["cpu_pct_of_a_core"].get("bench (clients)", 0.0)
        events, delivered, resyncs = "", "", ""
        if "events_per_client_per_s" in w:
            e = w["events_per_client_per_s"]
            events = f"{e['min']} / {e['median']}"
            delivered = f"{w['delivered_pct']}%"
            resyncs = str(w["resyncs"]["total"])
        print(
            f"{label:<22} {w['per_s']:>9} {w['dashboard_cpu_pct']:>11} "
            f"{w['dashboard_peak_rss_mib']:>13} {bench_cpu:>12} {events:>29} {delivered:>10} "
            f"{resyncs:>8}"
        )
    w = lv["with_clients"]
    print(
        f"throughput lost with clients: {lv['loss_pct']}% (against the mean of both windows "
        f"without); connected {w['connected']}/{w['clients']}"
        + (f"; client errors: {w['client_errors']}" if w["client_errors"] else "")
    )


# ---- main ---------------------------------------------------------------------------------


def timed(what: Callable[[], Any]) -> tuple[Any, float]:
    t0 = time.monotonic()
    found = what()
    return found, round(time.monotonic() - t0, 1)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--finished", type=int, default=100_000, help="finished machines stored")
    parser.add_argument("--history", type=int, default=1_000_000, help="history rows stored")
    parser.add_argument("--requests", type=int, default=200, help="requests per endpoint")
    parser.add_argument(
        "--unfolded-requests", type=int, default=20, help="requests of the unfolded statistics"
    )
    parser.add_argument("--budget", type=float, default=120.0, help="most seconds per endpoint")
    parser.add_argument("--clients", type=int, default=100, help="live-feed (SSE) clients")
    parser.add_argument("--seconds", type=float, default=10.0, help="each live window")
    parser.add_argument("--machines", type=int, default=1000, help="machines the engine drives")
    parser.add_argument("--load", type=float, default=0.5, help="share of the maximum")
    parser.add_argument("--mode", choices=["inline", "celery"], default="inline")
    parser.add_argument(
        "--firehose",
        action="store_true",
        help="clients take every event (a tool), not a list page's machines",
    )
    parser.add_argument("--record", metavar="CONDITIONS", help=RECORD_HELP)
    args = parser.parse_args()
    top = run_engine(
        args.machines,
        prefill=fill(args.finished, args.history),
        mode=args.mode,
        seconds=args.seconds,
    )
    prefill = fill(args.finished, args.history, fold=False)  # the reads fold it themselves
    env = deployment("dash", transition_mode=args.mode, viewer_token=VIEWER_TOKEN)
    try:
        _, fill_s = timed(lambda: prefill(env))
        dashboard, base = start_dashboard(env)
        read_results = reads(env, base, args)
        read_results["dashboard_rss_after_reads_mib"] = round(rss_mib(dashboard), 1)
        live_results = live(env, base, dashboard, top["sustained_per_s"], args)
    finally:
        tear_down(env)
    result = {
        "mode": args.mode,
        "finished": args.finished,
        "history": args.history,
        "requests": args.requests,
        "clients": args.clients,
        "seconds": args.seconds,
        "machines": args.machines,
        "prefill_s": fill_s,
        "max_run": top,
        "reads": read_results,
        "live": live_results,
    }
    print_table(result)
    print(f"written {write_result('dashboard', result)}")
    if args.record is not None:
        print(f"recorded {record_current('dashboard', row(result), args.record)}")


def row(result: dict[str, Any]) -> dict[str, Any]:
    """The figures of the documents' dashboard row."""
    endpoints, live = result["reads"]["endpoints"], result["live"]
    return {
        "finished": result["finished"],
        "history": result["history"],
        "list_p50_ms": endpoints["list"]["p50_ms"],
        "list_p99_ms": endpoints["list"]["p99_ms"],
        "machine_p50_ms": endpoints["machine"]["p50_ms"],
        "machine_p99_ms": endpoints["machine"]["p99_ms"],
        "stats_p50_ms": endpoints["stats_folded"]["p50_ms"],
        "stats_p99_ms": endpoints["stats_folded"]["p99_ms"],
        "stats_unfolded_p50_ms": endpoints["stats_unfolded"]["p50_ms"],
        "pages": result["clients"],
        "load": live["load"],
        "max_per_s": live["max_per_s"],
        "engine_loss_pct": live["loss_pct"],
    }


if __name__ == "__main__":
    main()
