"""Flood: junk messages poured into the ack streams beside an agent acking at once; the valid
acks' throughput during the flood against the same deployment without one, how long the bridge
takes to drain the junk, and what the junk leaves behind.

    .venv/bin/python -m bench.flood [--machines 1000] [--junk 100000] [--seconds 10]

One deployment, five windows: no flood; a flood into a flooder's own ack stream
(`stream:state:ack:<a fresh uuid>`, the per-agent path); no flood; a flood into the shared stream
(`stream:state:ack`, the seed's path); no flood. The machines (bench_loop) are stored due for
dispatch and entered by the scan before the agent starts, as in bench/throughput.py.

The junk, written by a thread in pipelines of a thousand, as fast as Redis takes it: a quarter
each of malformed JSON, schema violations, acks with forged tokens for the real machines (refused
as wrong_agent from the flooder's own stream, as bad_token from the shared one), and well-formed
acks for machines that do not exist, plus a few payloads of 1.1 MiB. A flood's window runs from
its first XADD until the bridge has emptied the junk stream (an entry is deleted only once the
transaction that recorded it has committed). Valid throughput during a flood is given as a ratio
to the first window without one, and to the mean of the two around it (this shared machine's
speed drifts).

Redis: database 15 by default (FSM_BENCH_REDIS_URL), never flushed; every key this benchmark
writes carries its own channel prefix or queue name, and is deleted at the end.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

os.environ.setdefault("FSM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/15")

import redis
from sqlalchemy import text

from bench.common import (
    CpuMeter,
    FsmEnv,
    deployment,
    dispatched,
    last_history_id,
    spawn_fast_agent,
    store_machines,
    tear_down,
    transitions,
    wait,
    write_result,
)
from bench.memory import rss_mb
from fsm_celery.core.messages import ack_stream, agent_ack_stream

OVERSIZED = 5  # payloads of 1.1 MiB in each flood (the limit is 1 MiB)
OVERSIZED_BYTES = int(1.1 * 2**20)
PIPELINE = 1000  # XADDs per round trip of the flooder
SAMPLE_S = 0.25  # how often a flood's progress is read


def junk(count: int, machine_ids: list[str]) -> list[str]:
    """count junk payloads: a quarter each of malformed JSON, schema violations, forged tokens
    for real machines and acks for unknown machines, with OVERSIZED huge ones spread among
    them."""
    huge = json.dumps({"type": "state_ack", "pad": "x" * OVERSIZED_BYTES})
    every = max(count // OVERSIZED, 1)
    payloads = []
    for n in range(count):
        machine = machine_ids[n % len(machine_ids)]
        if n % every == every // 2 and n // every < OVERSIZED:
            payloads.append(huge)
        elif n % 4 == 0:
            payloads.append(('{"type": "state_ack", "machineId": "', "not json", "[1, 2,")[n % 3])
        elif n % 4 == 1:
            payloads.append(
                json.dumps(
                    {"type": "state_ack", "machineId": machine, "state": "S0", "success": "yes"}
                )
            )
        else:
            target = machine if n % 4 == 2 else str(uuid.uuid4())
            payloads.append(
                json.dumps(
                    {
                        "type": "state_ack",
                        "machineId": target,
                        "state": "S0",
                        "attempt": n % 7 + 1,
                        "taskToken": f"{n:064x}",
                        "success": True,
                        "output": {},
                    }
                )
            )
    return payloads


class Flooder(threading.Thread):
    """XADDs the payloads to a stream as fast as Redis takes them, on its own connection."""

    def __init__(self, redis_url: str, stream: str, payloads: list[str]) -> None:
        super().__init__(name="flooder", daemon=True)
        self.client = redis.Redis.from_url(redis_url)
        self.stream, self.payloads = stream, payloads
        self.seconds = 0.0
        self.stream_bytes = 0  # Redis memory of the stream once all is written

    def run(self) -> None:
        t0 = time.monotonic()
        for start in range(0, len(self.payloads), PIPELINE):
            pipe = self.client.pipeline(transaction=False)
            for payload in self.payloads[start : start + PIPELINE]:
                pipe.xadd(self.stream, {"message": payload})
            pipe.execute()
        self.seconds = time.monotonic() - t0
        self.stream_bytes = int(self.client.memory_usage(self.stream, samples=0) or 0)
        self.client.close()


@dataclass
class RssSampler:
    """The bridge's summed RSS (all its processes), sampled every 0.1 s on a thread."""

    env: FsmEnv
    samples: list[tuple[float, float]] = field(default_factory=list)
    stop: threading.Event = field(default_factory=threading.Event)

    def start(self) -> None:
        threading.Thread(target=self._run, name="rss", daemon=True).start()

    def _run(self) -> None:
        while not self.stop.wait(0.1):
            self.samples.append((time.monotonic(), rss_mb(self.env, "bridge")))

    def peak(self, t0: float, t1: float) -> float:
        return max((mb for t, mb in self.samples if t0 <= t <= t1), default=0.0)


def scalar(env: FsmEnv, sql: str) -> Any:
    with env.client.engine.db.connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def rejections(env: FsmEnv) -> tuple[int, int]:
    """How many rejected messages are stored, and the table's size on disk (with its indexes
    and TOAST) in bytes."""
    rows = scalar(env, "SELECT count(*) FROM rejected_messages")
    size = scalar(env, "SELECT pg_total_relation_size('rejected_messages')")
    return int(rows), int(size)


def reasons_since(env: FsmEnv, after_id: int) -> dict[str, int]:
    statement = text(
        "SELECT reason, count(*) FROM rejected_messages WHERE id > :after GROUP BY reason"
    )
    with env.client.engine.db.connect() as conn:
        return {r: int(n) for r, n in conn.execute(statement, {"after": after_id})}


def acks_after(env: FsmEnv, after_id: int) -> tuple[int, int]:
    """Acks applied in history rows after after_id, and the newest row's id: the timeline's
    cheap counter (a row committed after a newer one was counted is missed; the window's figure
    is counted whole at its end)."""
    statement = text(
        "SELECT count(*) FILTER (WHERE event = 'ack'), coalesce(max(id), :after) "
        "FROM state_transitions WHERE id > :after"
    )
    with env.client.engine.db.connect() as conn:
        count, newest = conn.execute(statement, {"after": after_id}).one()
    return int(count), int(newest)


def measure(
    env: FsmEnv,
    meter: CpuMeter,
    rss: RssSampler,
    until: Callable[[], bool],
    progress: Callable[[], int] = lambda: 0,
) -> dict[str, Any]:
    """Valid transitions per second from now until `until()` holds, sampled every SAMPLE_S
    (with progress(), what is left of a flood), CPU by process group, the bridge's peak RSS
    and the rejected messages written meanwhile."""
    rows0, size0 = rejections(env)
    last_rejection = int(scalar(env, "SELECT coalesce(max(id), 0) FROM rejected_messages"))
    mark = last_history_id(env)
    meter.start()
    t0 = time.monotonic()
    timeline, counted, seen = [], 0, mark
    while True:
        time.sleep(SAMPLE_S)
        now = time.monotonic()
        more, seen = acks_after(env, seen)
        counted += more
        timeline.append((round(now - t0, 2), counted, progress()))
        if until():
            break
    t1, done = time.monotonic(), transitions(env, mark)
    cpu = meter.stop()  # "other": other users' load (this benchmark shares its machine)
    cpu["other"] = max(cpu["other"], 0.0)
    rows1, size1 = rejections(env)
    seconds = t1 - t0
    return {
        "seconds": round(seconds, 2),
        "transitions": done,
        "valid_per_s": round(done / seconds, 1),
        "cores_busy": {k: round(v / seconds, 2) for k, v in sorted(cpu.items())},
        "bridge_peak_rss_mb": rss.peak(t0, t1),
        "rejected_rows": rows1 - rows0,
        "rejected_reasons": reasons_since(env, last_rejection),
        "table_bytes_before": size0,
        "table_bytes_after": size1,
        "timeline": timeline,
    }


def quiet(env: FsmEnv, meter: CpuMeter, rss: RssSampler, seconds: float) -> dict[str, Any]:
    """A window without a flood."""
    end = time.monotonic() + seconds
    return {"flood": None, **measure(env, meter, rss, lambda: time.monotonic() >= end)}


def flood(
    env: FsmEnv, meter: CpuMeter, rss: RssSampler, label: str, stream: str, payloads: list[str]
) -> dict[str, Any]:
    """A window from the flood's first XADD until the bridge has emptied its stream."""
    flooder = Flooder(env.settings.redis_url, stream, payloads)
    left = [len(payloads)]
    peak = [0]

    def backlog() -> int:
        left[0] = int(env.redis.xlen(stream))
        peak[0] = max(peak[0], left[0])
        return left[0]

    def drained() -> bool:
        return not flooder.is_alive() and left[0] == 0 and backlog() == 0

    flooder.start()
    result = measure(env, meter, rss, drained, backlog)
    return {
        "flood": label,
        "stream": stream.removeprefix(env.settings.channel_prefix),
        "junk": len(payloads),
        "xadd_s": round(flooder.seconds, 2),
        "backlog_peak": peak[0],
        "stream_bytes": flooder.stream_bytes,
        **result,
    }


def forget_keys(env: FsmEnv) -> None:
    """Delete the keys this deployment wrote (its channel prefix and its Celery queue)."""
    for pattern in (f"{env.settings.channel_prefix}*", f"{env.settings.queue}*"):
        keys = list(env.redis.scan_iter(match=pattern, count=1000))
        for start in range(0, len(keys), 1000):
            env.redis.delete(*keys[start : start + 1000])


def run(machines: int, count: int, seconds: float, bridges: int) -> list[dict[str, Any]]:
    env = deployment("flood", flush_redis=False)
    rss = RssSampler(env)
    agent = None
    try:
        env.start_worker(beat=True)
        env.start_bridge(processes=bridges)
        agent_id = str(uuid.uuid4())
        store_machines(env, "bench_loop", "S0", machines, agent_id)
        dispatched(env, agent_id, machines)
        agent = spawn_fast_agent(env, agent_id)
        meter = CpuMeter.of(env, {"agent": [agent.pid], "driver": [os.getpid()]})
        rss.start()
        wait(lambda: transitions(env, 0) >= 1, 60, "the first transition")
        time.sleep(2.0)  # warm-up
        with env.client.engine.db.connect() as conn:
            ids = [str(i) for i in conn.execute(text("SELECT id FROM state_machines")).scalars()]
        payloads = junk(count, ids)
        prefix = env.settings.channel_prefix
        own = agent_ack_stream(str(uuid.uuid4()), prefix)
        windows = [quiet(env, meter, rss, seconds)]
        windows.append(flood(env, meter, rss, "own stream", own, payloads))
        windows.append(quiet(env, meter, rss, seconds))
        windows.append(flood(env, meter, rss, "shared stream", ack_stream(prefix), payloads))
        windows.append(quiet(env, meter, rss, seconds))
        if agent.poll() is not None:  # e.g. Redis restarted under it: the figures are void
            raise RuntimeError(f"the agent exited with {agent.returncode} during the run")
        return windows
    finally:
        rss.stop.set()
        if agent is not None:
            agent.terminate()
            agent.wait(15)
        try:
            tear_down(env)
        finally:
            forget_keys(env)


def mib(size: int) -> str:
    return f"{size / 2**20:.1f}"


def report(windows: list[dict[str, Any]]) -> None:
    """The table of the windows, then each flood's rejections and timeline."""
    _table(windows)
    print("\ncores busy during each window (other: the rest of this shared machine):")
    for w in windows:
        name = f"flood: {w['flood']}" if w["flood"] else "no flood"
        cpu = "  ".join(f"{k} {v}" for k, v in w["cores_busy"].items())
        print(f"  {name:<20} {cpu}")
    for w in windows:
        if w["flood"]:
            _flood_details(w)


def _table(windows: list[dict[str, Any]]) -> None:
    base = windows[0]["valid_per_s"]
    print(
        f"\n{'window':<20} {'s':>6} {'valid/s':>8} {'ratio':>6} {'local':>6} {'XADD s':>7} "
        f"{'backlog':>8} {'in Redis':>9} {'junk/s':>7} {'rejected rows':>14} {'table MiB':>12} "
        f"{'bridge RSS':>11}"
    )
    for i, w in enumerate(windows):
        flood_cells = ["", "", "", "", ""]
        if w["flood"] is not None:
            around = [windows[j]["valid_per_s"] for j in (i - 1, i + 1) if 0 <= j < len(windows)]
            flood_cells = [
                f"{w['valid_per_s'] / (sum(around) / len(around)):.2f}",
                f"{w['xadd_s']:.2f}",
                f"{w['backlog_peak']:,}",
                f"{mib(w['stream_bytes'])} MiB",
                f"{w['junk'] / w['seconds']:,.0f}",
            ]
        local, xadd, backlog, in_redis, rate = flood_cells
        name = f"flood: {w['flood']}" if w["flood"] else "no flood"
        table = f"{mib(w['table_bytes_before'])}->{mib(w['table_bytes_after'])}"
        print(
            f"{name:<20} {w['seconds']:>6.1f} {w['valid_per_s']:>8,.0f} "
            f"{w['valid_per_s'] / base:>6.2f} {local:>6} {xadd:>7} {backlog:>8} {in_redis:>9} "
            f"{rate:>7} {w['rejected_rows']:>14,} {table:>12} {w['bridge_peak_rss_mb']:>7.1f} MiB"
        )
    print(
        "\nvalid/s: transitions applied per second; ratio: to the first window without a flood;"
        "\nlocal: to the mean of the windows without a flood just before and after it;"
        "\ns: the window (a flood's lasts from its first XADD until its stream is empty);"
        "\nXADD s: how long the flooder took to write the junk; backlog: the junk stream's"
        "\nlongest; in Redis: its MEMORY USAGE once the junk was written; junk/s: junk drained"
        "\nper second of the window; table: pg_total_relation_size(rejected_messages), with"
        "\nits indexes and TOAST; bridge RSS: the peak of all its processes' summed RSS."
    )


def _flood_details(w: dict[str, Any]) -> None:
    print(f"\nflood: {w['flood']} ({w['stream']}): rejected by reason")
    if w["rejected_rows"] != w["junk"]:
        print(
            f"  ({w['junk'] - w['rejected_rows']:,} junk messages not recorded: trimmed past "
            "FSM_ACK_STREAM_MAXLEN, or lost with a restart of Redis)"
        )
    print("  " + ", ".join(f"{k} {v:,}" for k, v in sorted(w["rejected_reasons"].items())))
    step, cells = _cells(w["timeline"])
    print(f"  every {step:.0f} s: valid transitions/s / junk entries left in the stream")
    for start in range(0, len(cells), 8):
        print("  " + "  ".join(f"{c:>15}" for c in cells[start : start + 8]))


def _cells(timeline: list[tuple[float, int, int]]) -> tuple[float, list[str]]:
    """The timeline in about twenty steps of whole seconds: valid transitions per second in
    each, and the junk left at its end."""
    step = max(1.0, round(timeline[-1][0] / 20)) if timeline else 1.0
    cells, last_t, last_n = [], 0.0, 0
    for t, n, left in timeline:
        if t - last_t >= step or (t, n, left) == timeline[-1]:
            cells.append(f"{(n - last_n) / (t - last_t):,.0f}/{left:,}")
            last_t, last_n = t, n
    return step, cells


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--junk", type=int, default=100_000, help="junk messages per flood")
    parser.add_argument("--seconds", type=float, default=10.0, help="each window without a flood")
    parser.add_argument("--bridges", type=int, default=2, help="ack bridge processes")
    args = parser.parse_args()
    windows = run(args.machines, args.junk, args.seconds, args.bridges)
    report(windows)
    path = write_result("flood", {"args": vars(args), "windows": windows})
    print(f"written {path}")


if __name__ == "__main__":
    main()
