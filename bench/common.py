"""A deployment on this machine for benchmarks: its own database, queue and processes.

It reuses the tests' support package (real PostgreSQL, Redis, `celery worker`, `fsm-celery
ack-bridge`), on its own Redis database so that it never touches the tests' data.
"""

from __future__ import annotations

import json
import os
import platform
import shlex
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import text

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
PG_URL = os.environ.get("FSM_BENCH_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432")
REDIS_URL = os.environ.get("FSM_BENCH_REDIS_URL", "redis://127.0.0.1:6379/13")
os.environ["FSM_REDIS_URL"] = REDIS_URL  # before fsm_celery reads its settings

from bench import figures  # noqa: E402
from fsm_celery.core.messages import task_stream  # noqa: E402
from tests.support.databases import create_template, drop_database  # noqa: E402
from tests.support.processes import FsmEnv, database_name, make_env  # noqa: E402

TEMPLATE = f"fsm_bench_template_{os.getpid()}"


def deployment(
    name: str, *, flush_redis: bool = True, pg_url: str | None = None, **settings: Any
) -> FsmEnv:
    """A fresh deployment with the bench definitions loaded (on an emptied Redis database,
    unless flush_redis is false: its channel prefix and queue are its own anyway); pg_url: the
    server its processes reach it through (a PgBouncer before PG_URL's, say)."""
    import redis

    if flush_redis:
        redis.Redis.from_url(REDIS_URL).flushdb()
    create_template(PG_URL, TEMPLATE)
    # The figures of docs/performance-history.md up to issue 12 are of the inline mode; a benchmark
    # that measures the celery mode says so (bench/throughput.py --modes).
    settings.setdefault("transition_mode", "inline")
    env = make_env(name, pg_url or PG_URL, TEMPLATE, REDIS_URL, **settings)
    env.client.load_definitions(str(ROOT / "bench" / "definitions"))
    return env


def tear_down(env: FsmEnv) -> None:
    env.stop_all()
    env.client.engine.db.dispose()
    drop_database(PG_URL, database_name(env))
    drop_database(PG_URL, TEMPLATE)


def store_machines(env: FsmEnv, machine_type: str, state: str, count: int, agent_id: str) -> None:
    """Store count running machines due for dispatch (set-based SQL): the scan then enters
    every one of them, 500 per transaction, on the real path."""
    with env.client.engine.db.begin() as conn:
        conn.execute(
            text("""
            INSERT INTO state_machines (id, type, agent_type, current_state, context, status,
                definition_version, attempt, agent_id, agent_pinned, dispatch_due_at)
            SELECT gen_random_uuid(), :type, 'bench', :state, '{}'::jsonb, 'running',
                1, 1, CAST(:agent AS uuid), true, now()
            FROM generate_series(1, :n)"""),
            {"n": count, "agent": agent_id, "type": machine_type, "state": state},
        )


def dispatched(env: FsmEnv, agent_id: str, count: int) -> None:
    """Wait until count tasks wait in the agent's stream."""
    stream = task_stream(agent_id, env.settings.channel_prefix)
    wait(lambda: env.redis.xlen(stream) >= count, 600, "the first dispatches")


def start_machines(env: FsmEnv, machine_type: str, count: int, agent_id: str) -> list[Any]:
    """Start count machines for the agent as fast as the API allows."""
    return [env.client.start_machine(machine_type, {}, agent_id=agent_id) for _ in range(count)]


def transitions(env: FsmEnv, after_id: int = 0) -> int:
    """How many acks were applied in history rows after after_id (the primary key's index keeps
    this cheap on a large table, so measuring does not slow down what it measures)."""
    statement = text("SELECT count(*) FROM state_transitions WHERE id > :after AND event = 'ack'")
    with env.client.engine.db.connect() as conn:
        return int(conn.execute(statement, {"after": after_id}).scalar_one())


def last_history_id(env: FsmEnv) -> int:
    """The newest history row's id."""
    with env.client.engine.db.connect() as conn:
        found = conn.execute(text("SELECT coalesce(max(id), 0) FROM state_transitions"))
        return int(found.scalar_one())


@dataclass
class CpuMeter:
    """CPU seconds used by groups of processes between start() and stop(), and by everything
    else on the machine ("other": the driver, and whatever else ran: on a shared machine, the
    load the figures were measured beside)."""

    groups: dict[str, list[psutil.Process]]
    before: dict[str, float] = field(default_factory=dict)

    @staticmethod
    def of(env: FsmEnv, extra: dict[str, list[int]] | None = None) -> CpuMeter:
        groups: dict[str, list[psutil.Process]] = {}
        for proc in env.procs:
            if proc.popen.poll() is None:
                parent = psutil.Process(proc.popen.pid)
                groups.setdefault(proc.name, []).extend([parent, *parent.children(True)])
        for name, pids in (extra or {}).items():
            groups[name] = [psutil.Process(p) for p in pids]
        groups["postgres"] = [
            p for p in psutil.process_iter(["name"]) if p.info["name"] in ("postgres", "postmaster")
        ]
        groups["redis"] = [
            p for p in psutil.process_iter(["name"]) if p.info["name"] == "redis-server"
        ]
        return CpuMeter(groups)

    def _read(self) -> dict[str, float]:
        for name, wanted in (
            ("postgres", ("postgres", "postmaster")),
            ("redis", ("redis-server",)),
        ):
            known = {p.pid for p in self.groups[name]}
            self.groups[name] += [
                p
                for p in psutil.process_iter(["name"])
                if p.info["name"] in wanted and p.pid not in known
            ]
        totals = {}
        for name, procs in self.groups.items():
            total = 0.0
            for p in procs:
                try:
                    t = p.cpu_times()
                    total += t.user + t.system
                except psutil.Error:
                    pass
            totals[name] = total
        totals["other"] = machine_busy() - sum(totals.values())
        return totals

    def start(self) -> None:
        self.before = self._read()

    def stop(self) -> dict[str, float]:
        after = self._read()
        return {name: after[name] - self.before.get(name, 0.0) for name in after}


def machine_busy() -> float:
    """CPU seconds the whole machine has spent busy since it started (guest time is counted in
    user time already)."""
    times = psutil.cpu_times()
    idle = ("idle", "iowait", "guest", "guest_nice")
    return float(sum(getattr(times, name) for name in times._fields if name not in idle))


def machine_info() -> dict[str, Any]:
    return {
        "cpus": os.cpu_count(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "memory_gb": round(psutil.virtual_memory().total / 2**30, 1),
    }


def write_result(name: str, result: dict[str, Any]) -> Path:
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({"machine": machine_info(), **result}, indent=2))
    return path


def commit() -> str:
    """The commit measured, `-dirty` when the code differs from it (recorded figures aside)."""
    head = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True
    )
    changed = subprocess.run(
        ["git", "diff", "--quiet", "HEAD", "--", ".", ":!bench/results"], cwd=ROOT
    ).returncode
    return head.stdout.strip() + ("-dirty" if changed else "")


def record_current(benchmark: str, run_figures: dict[str, Any], conditions: str) -> Path:
    """Record this run as the current one of its row of the documents' table
    (bench/results/current/, committed; `make figures` then regenerates the table).
    conditions says what else ran on the machine: on a shared one the figures move a lot."""
    name = figures.row_name(benchmark, run_figures)
    record = {
        "schema": figures.SCHEMA,
        "benchmark": benchmark,
        "date": datetime.now(UTC).date().isoformat(),
        "commit": commit(),
        "machine": machine_info(),
        "command": shlex.join(["python", "-m", f"bench.{benchmark}", *sys.argv[1:]]),
        "conditions": conditions,
        "source": "measured",
        "figures": run_figures,
    }
    figures.check(name, record)
    figures.CURRENT.mkdir(parents=True, exist_ok=True)
    path = figures.CURRENT / f"{name}.json"
    path.write_text(json.dumps(record, indent=2, ensure_ascii=False) + "\n")
    return path


RECORD_HELP = (
    "record this run as the current figures (bench/results/current/, then `make figures`); "
    "CONDITIONS says what else ran on the machine"
)


def plain_worker_argv(app: str, queue: str, concurrency: int, pool: str) -> list[str]:
    """A `celery worker` of a plain-Celery baseline app (bench/chain_app.py, bench/chord_app.py),
    started as fsm-celery's are but logging warnings only (a line per task would cost more than
    the task); add `-n NAME` to run more than one."""
    return [
        sys.executable,
        "-m",
        "celery",
        "-A",
        app,
        "worker",
        "-Q",
        queue,
        "-c",
        str(concurrency),
        "-P",
        pool,
        "-l",
        "warning",
        "--without-mingle",
        "--without-gossip",
    ]


def spawn_fast_agent(
    env: FsmEnv,
    agent_id: str,
    rate: float = 0.0,
    log: Path | None = None,
    agent_type: str | None = None,
    one_at_a_time: bool = False,
) -> subprocess.Popen[bytes]:
    """The fast agent, answering its own stream's tasks, or those of its type's stream (it is
    then registered as of the type, whose unassigned machines accept its acks); or, one at a
    time, a task read, answered and acknowledged before the next (bench/fast_agent.py)."""
    environ = {**env.env, **({"FAST_AGENT_LOG": str(log)} if log else {})}
    if one_at_a_time:
        environ["FAST_AGENT_ONE_AT_A_TIME"] = "1"
    if agent_type is not None:
        env.client.register_agent(agent_id, agent_type)
        environ["FAST_AGENT_TASKS"] = agent_type
    argv = [sys.executable, str(ROOT / "bench" / "fast_agent.py"), agent_id]
    if rate:
        argv.append(str(rate))
    return subprocess.Popen(argv, cwd=ROOT, env=environ, start_new_session=True)


def wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.05)
