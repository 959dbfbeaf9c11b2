"""Throughput: N machines driven by an agent that acks at once; transitions per second
sustained over a steady state, CPU per transition by process, and two baselines measured in the
same run.

    .venv/bin/python -m bench.throughput [--machines 1 100 1000 10000] [--seconds 10]
        [--modes celery inline] [--brokers redis amqp] [--rabbitmq-url URL] [--runs 3]
        [--workers 2] [--pool threads] [--concurrency 16] [--agent batch|one]
        [--start stored|api] [--record CONDITIONS]

--brokers amqp runs Celery's tasks on RabbitMQ (quorum queues, publisher confirms: what
FSM_BROKER_URL=amqp://... deploys), the agents staying on Redis: a RabbitMQ node of the
bench's own (tests/support/rabbitmq.py) unless --rabbitmq-url names one; its baselines' chains
then run on RabbitMQ too.

The machines (bench_loop: two states in a loop) are stored due for dispatch and entered by the
scan before the agent starts; then every ack moves one on, for as long as it measures. With
--start api it is an independent driver's run instead (issue 42): from a cold start, machines
of two states that end (bench_pair) started one after another through the Python API, timed
from the first start until the last completed.

Baselines: a plain Celery chain of no-op tasks each enqueuing the next (same broker, same worker
settings), and the bare transition transaction (lock the row, update it, insert the history row)
run from Python on one connection. Each round runs the project and then the baselines; a headline
figure is the median of the rounds, printed with its spread, and a ratio is taken within each
round (a run against the chain of its own round) before the median of those.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psutil
from sqlalchemy import create_engine, text

from bench.common import (
    PG_URL,
    RECORD_HELP,
    CpuMeter,
    FsmEnv,
    deployment,
    dispatched,
    last_history_id,
    plain_worker_argv,
    record_current,
    spawn_fast_agent,
    start_machines,
    store_machines,
    tear_down,
    transitions,
    wait,
    write_result,
)
from tests.support.rabbitmq import RabbitMQ, celery_app


def run_engine(
    machines: int,
    concurrency: int = 16,
    prefill: Callable[[FsmEnv], object] | None = None,
    bridges: int = 2,
    seconds: float = 10.0,
    mode: str = "celery",
    pool: str = "threads",
    workers: int = 2,
    broker: Broker | None = None,
    agent: str = "batch",
    start: str = "stored",
    **settings: Any,
) -> dict[str, Any]:
    """Our figure: machines looping through two states for as long as it measures; transitions
    per second over `seconds` of steady state, after two seconds of warm-up (`settings`: the
    deployment's, pg_url among them: bench.deployment; `broker`: RabbitMQ's, else Redis).
    start "api": an independent driver's figure instead (run_started)."""
    if broker is not None:
        settings["broker_url"] = broker.url
    env = deployment(f"tp{machines}_{mode}", transition_mode=mode, **settings)
    try:
        if prefill is not None:
            prefill(env)
        after = last_history_id(env)
        start_workers(env, workers, pool, concurrency)
        env.start_bridge(processes=bridges)
        if start == "api":
            return run_started(env, machines, mode, agent, after)
        agent_id = str(uuid.uuid4())
        # Every machine is stored and its first task dispatched before the agent runs, so that
        # what is measured is the machines' transitions, not how fast a client starts them.
        store_machines(env, "bench_loop", "S0", machines, agent_id)
        dispatched(env, agent_id, machines)
        answering = spawn_fast_agent(env, agent_id, one_at_a_time=agent == "one")
        measured = {"agent": [answering.pid], **(broker.processes() if broker else {})}
        meter = CpuMeter.of(env, measured)
        wait(lambda: transitions(env, after) >= 1, 60, "the first transition")
        time.sleep(2.0)
        t0, n0, wal0 = time.monotonic(), transitions(env, after), wal_position(env)
        meter.start()
        time.sleep(seconds)
        t1, n1 = time.monotonic(), transitions(env, after)
        cpu = meter.stop()
        wal = wal_bytes_since(env, wal0)
        answering.terminate()
        done = n1 - n0
        return {
            "mode": mode,
            "broker": "amqp" if broker else "redis",
            "machines": machines,
            "agent": agent,
            "seconds": round(t1 - t0, 2),
            "transitions": done,
            "sustained_per_s": round(done / (t1 - t0), 1),
            "cpu_ms_per_transition": {k: round(v * 1000 / max(done, 1), 3) for k, v in cpu.items()},
            "wal_bytes_per_transition": round(wal / max(done, 1)),
        }
    finally:
        tear_down(env)


def run_started(env: FsmEnv, machines: int, mode: str, agent: str, after: int) -> dict[str, Any]:
    """An independent driver's figure, from a cold start: the agent waits on its stream, the
    machines (bench_pair: two states that end) are started one after another through the
    Python API, and the time runs from the first start until every machine completed; its
    transitions are the acks applied (two a machine)."""
    agent_id = str(uuid.uuid4())
    answering = spawn_fast_agent(env, agent_id, one_at_a_time=agent == "one")
    meter = CpuMeter.of(env, {"agent": [answering.pid]})
    try:
        time.sleep(1.0)  # the agent's consumer group, before its first task
        meter.start()
        t0, wal0 = time.monotonic(), wal_position(env)
        ids = start_machines(env, "bench_pair", machines, agent_id)
        started_s = time.monotonic() - t0
        wait(lambda: completed(env) >= len(ids), 600, "every machine to complete")
        elapsed = time.monotonic() - t0
        cpu = meter.stop()
        wal = wal_bytes_since(env, wal0)
    finally:
        answering.terminate()
    done = transitions(env, after)
    return {
        "mode": mode,
        "broker": "redis",
        "machines": machines,
        "agent": agent,
        "start": "api",
        "seconds": round(elapsed, 2),
        "started_s": round(started_s, 2),
        "transitions": done,
        "sustained_per_s": round(done / elapsed, 1),
        "cpu_ms_per_transition": {k: round(v * 1000 / max(done, 1), 3) for k, v in cpu.items()},
        "wal_bytes_per_transition": round(wal / max(done, 1)),
    }


def completed(env: FsmEnv) -> int:
    statement = text("SELECT count(*) FROM state_machines WHERE status = 'completed'")
    with env.client.engine.db.connect() as conn:
        return int(conn.execute(statement).scalar_one())


def wal_position(env: FsmEnv) -> str:
    """Where PostgreSQL's write-ahead log is now (the whole server's: the bench runs alone)."""
    with env.client.engine.db.connect() as conn:
        return str(conn.execute(text("SELECT pg_current_wal_lsn()")).scalar_one())


def wal_bytes_since(env: FsmEnv, position: str) -> int:
    with env.client.engine.db.connect() as conn:
        found = conn.execute(
            text("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), CAST(:p AS pg_lsn))"),
            {"p": position},
        ).scalar_one()
    return int(found)


def start_workers(
    env: FsmEnv, workers: int = 2, pool: str = "threads", concurrency: int = 16
) -> None:
    """As README.md says to run them: one worker per core (beat beside the first), of
    celeryconfig.py's 16 threads, logging warnings only (README.md's command sets no level:
    Celery's default)."""
    for n in range(workers):
        env.start_worker(beat=n == 0, concurrency=concurrency, pool=pool, log_level="warning")


def run_chain_baseline(
    chains: int = 200,
    steps: int = 20,
    concurrency: int = 16,
    pool: str = "threads",
    workers: int = 2,
    broker: Broker | None = None,
) -> dict[str, Any]:
    """Plain Celery: no-op tasks, each enqueuing the next, on the same broker and settings."""
    env = deployment("chain", **({"broker_url": broker.url} if broker else {}))
    try:
        argv = plain_worker_argv("bench.chain_app", env.settings.queue, concurrency, pool)
        for n in range(workers):
            env._spawn("chain-worker", [*argv, "-n", f"chain{n}@%h"])
        from bench.chain_app import _done, step

        counter = f"bench:chain:{uuid.uuid4().hex}"
        time.sleep(4)  # let the worker come up (it logs nothing at warning level)
        # This process's app sends to Redis; on RabbitMQ, an app declaring the queues alike.
        sender = celery_app(env.settings) if broker else step.app
        t0 = time.monotonic()
        for chain in range(chains):
            sender.send_task(step.name, (chain, steps, counter), queue=env.settings.queue)
        wait(lambda: int(_done.get(counter) or 0) >= chains, 600, "the chains")
        elapsed = time.monotonic() - t0
        return {
            "pool": f"{workers} x {pool} -c {concurrency}",
            "chains": chains,
            "steps": steps,
            "steps_per_s": round(chains * steps / elapsed, 1),
            "elapsed_s": round(elapsed, 2),
        }
    finally:
        tear_down(env)


def run_transaction_baseline(count: int = 5000, rows: int = 1000) -> dict[str, Any]:
    """The bare transition transaction from Python, one connection, one row per transaction."""
    env = deployment("txn")
    engine = create_engine(env.settings.database_url)
    try:
        ids = start_machines(env, "bench_chain", rows, str(uuid.uuid4()))
        statements = (
            text("SELECT attempt FROM state_machines WHERE id = :id FOR UPDATE"),
            text(
                "UPDATE state_machines SET attempt = attempt + 1, updated_at = now() WHERE id = :id"
            ),
            text(
                "INSERT INTO state_transitions (machine_id, from_state, to_state, success, "
                "attempt, event, machine_created_at) VALUES (:id, 'S00', 'S01', true, :attempt, "
                "'bench', (SELECT created_at FROM state_machines WHERE id = :id))"
            ),
        )
        t0 = time.monotonic()
        with engine.connect() as conn:
            for n in range(count):
                mid = ids[n % rows]
                with conn.begin():
                    attempt = conn.execute(statements[0], {"id": mid}).scalar_one()
                    conn.execute(statements[1], {"id": mid})
                    conn.execute(statements[2], {"id": mid, "attempt": 1000 + attempt})
        elapsed = time.monotonic() - t0
        return {"transactions": count, "per_s": round(count / elapsed, 1)}
    finally:
        engine.dispose()
        tear_down(env)


def row(rounds: list[Round], mode: str, machines: int) -> dict[str, Any]:
    """The figures of the documents' throughput row for a mode: the median of its runs, their
    spread, and its ratios to the baselines taken round by round (each run against the chains
    of its own round), their median and spread; CPU per transition by process, the median."""
    refs = [
        next(r for r in rnd.runs if (r["mode"], r["machines"]) == (mode, machines))
        for rnd in rounds
    ]
    rates = [r["sustained_per_s"] for r in refs]
    prefork = [rnd.chains[1]["steps_per_s"] for rnd in rounds]
    thread = [rnd.chains[0]["steps_per_s"] for rnd in rounds]
    x_prefork = [rate / chain for rate, chain in zip(rates, prefork, strict=True)]
    x_thread = [rate / chain for rate, chain in zip(rates, thread, strict=True)]
    processes = refs[0]["cpu_ms_per_transition"]
    return {
        "mode": mode,
        "machines": machines,
        "transitions_per_s": round(statistics.median(rates), 1),
        "runs": len(rounds),
        "spread_per_s": [min(rates), max(rates)],
        "x_prefork_chain": round(statistics.median(x_prefork), 2),
        "x_prefork_chain_spread": [round(min(x_prefork), 2), round(max(x_prefork), 2)],
        "prefork_chain_steps_per_s": round(statistics.median(prefork), 1),
        "x_thread_chain": round(statistics.median(x_thread), 2),
        "thread_chain_steps_per_s": round(statistics.median(thread), 1),
        "bare_transaction_per_s": round(statistics.median(rnd.txn["per_s"] for rnd in rounds), 1),
        "cpu_ms_per_transition": {
            name: round(statistics.median(r["cpu_ms_per_transition"][name] for r in refs), 3)
            for name in processes
        },
    }


class Broker:
    """RabbitMQ for Celery's tasks: a node of the bench's own, or the one at a URL given."""

    def __init__(self, url: str | None) -> None:
        self._folder = Path(tempfile.mkdtemp(prefix="fsm-bench-rabbitmq-")) if not url else None
        self.node = RabbitMQ.start(self._folder) if self._folder else None
        self.url = self.node.url if self.node else str(url)

    def processes(self) -> dict[str, list[int]]:
        """Its processes, for the CPU they use (none known of a node at a URL)."""
        if self.node is None or self.node.process is None:
            return {}
        root = psutil.Process(self.node.process.pid)
        return {"rabbitmq": [root.pid, *(p.pid for p in root.children(recursive=True))]}

    def stop(self) -> None:
        if self.node is not None and self._folder is not None:
            self.node.stop()
            shutil.rmtree(self._folder, ignore_errors=True)


BROKERS_HELP = (
    "Celery's broker for the project and its chains, each in every round: redis (FSM_REDIS_URL), "
    "amqp (RabbitMQ)"
)


def _round(
    args: argparse.Namespace, workers: dict[str, Any], broker: Broker | None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """One round's runs of the project and its chains, on the broker (else Redis)."""
    runs = [
        run_engine(
            n,
            bridges=args.bridges,
            seconds=args.seconds,
            mode=mode,
            broker=broker,
            agent=args.agent,
            start=args.start,
            **workers,
        )
        for mode in args.modes
        for n in args.machines
    ]
    # The chain on the same workers, and on Celery's defaults (one prefork worker, 2
    # processes here: one per core), which is what a plain Celery deployment runs.
    chains = [
        run_chain_baseline(broker=broker, **workers),
        run_chain_baseline(concurrency=2, pool="prefork", workers=1, broker=broker),
    ]
    return runs, chains


def against_redis(rounds: list[Round], mode: str, machines: int) -> dict[str, Any]:
    """RabbitMQ's rate over Redis's, round by round (the median and spread), and Redis's."""

    def rate(rnd: Round) -> float:
        found = next(r for r in rnd.runs if (r["mode"], r["machines"]) == (mode, machines))
        return float(found["sustained_per_s"])

    on = {name: [r for r in rounds if r.broker == name] for name in ("amqp", "redis")}
    pairs = list(zip(on["amqp"], on["redis"], strict=True))  # of each round
    ratios = [rate(amqp) / rate(redis) for amqp, redis in pairs]
    return {
        "redis_transitions_per_s": round(statistics.median(rate(r) for _, r in pairs), 1),
        "x_redis": round(statistics.median(ratios), 2),
        "x_redis_spread": [round(min(ratios), 2), round(max(ratios), 2)],
    }


@dataclass
class Round:
    """One round of the benchmark: every run of the project, then the baselines."""

    runs: list[dict[str, Any]]
    chains: list[dict[str, Any]]  # on the project's workers, then on one prefork worker
    txn: dict[str, Any]
    broker: str = "redis"  # Celery's, for the project and its chains


def _report(args: argparse.Namespace, rounds: list[Round]) -> None:
    """Each round's figures, then each row's (recorded with --record)."""
    print(f"\nworkers: {args.workers} x {args.pool} -c {args.concurrency}; {args.runs} round(s)")
    print(
        f"{'mode':>7} {'machines':>9} {'transitions':>12} {'sustained/s':>12}"
        "  CPU ms per transition"
    )
    for number, rnd in enumerate(rounds, start=1):
        for r in rnd.runs:
            cpu = "  ".join(f"{k} {v}" for k, v in sorted(r["cpu_ms_per_transition"].items()))
            figures = f"{r['machines']:>9} {r['transitions']:>12} {r['sustained_per_s']:>12}"
            print(f"{r['mode']:>7} {figures}  {cpu}  (round {number}, {rnd.broker})")
        for chain in rnd.chains:
            shape = f"{chain['chains']}x{chain['steps']}"
            print(f"plain Celery chain ({shape}, {chain['pool']}): {chain['steps_per_s']} steps/s")
        print(f"bare transition transaction (1 connection): {rnd.txn['per_s']} tx/s")
    for mode, broker in ((m, b) for m in args.modes for b in args.brokers):
        machines = 1000 if 1000 in args.machines else args.machines[-1]
        figures = row([r for r in rounds if r.broker == broker], mode, machines)
        if broker != "redis":
            figures["broker"] = broker
            figures.update(against_redis(rounds, mode, machines) if "redis" in args.brokers else {})
            mode = f"{mode} (Celery on RabbitMQ)"
        low, high = figures["spread_per_s"]
        x_low, x_high = figures["x_prefork_chain_spread"]
        print(
            f"{mode} mode at {machines} machines: {figures['transitions_per_s']} transitions/s "
            f"(median of {args.runs}; {low}-{high}) = {figures['x_prefork_chain']}x the chain "
            f"on 1 x prefork -c 2 ({x_low}-{x_high}x round by round), "
            f"{figures['x_thread_chain']}x the chain on the project's workers; "
            f"other load {figures['cpu_ms_per_transition'].get('other', 0)} ms per transition"
        )
        if args.record is not None:
            print(f"recorded {record_current('throughput', figures, args.record)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--machines", type=int, nargs="+", default=[1, 100, 1000, 10000])
    parser.add_argument("--workers", type=int, default=2, help="worker processes")
    parser.add_argument("--pool", default="threads", choices=["threads", "solo", "prefork"])
    parser.add_argument(
        "--concurrency", type=int, default=16, help="each worker's pool size (celeryconfig: 16)"
    )
    parser.add_argument("--bridges", type=int, default=2, help="ack bridge processes")
    parser.add_argument(
        "--agent",
        choices=["batch", "one"],
        default="batch",
        help="the agent: a thousand tasks read and answered at once (batch), or one task "
        "read, answered and acknowledged before the next (one: a plain redis-py agent)",
    )
    parser.add_argument(
        "--start",
        choices=["stored", "api"],
        default="stored",
        help="stored: machines looping, stored before the run, measured in a steady state; "
        "api: an independent driver's run, from a cold start, of machines of two states that "
        "end, started one after another through the Python API",
    )
    parser.add_argument("--seconds", type=float, default=10.0, help="steady state measured")
    parser.add_argument(
        "--modes", nargs="+", choices=["celery", "inline"], default=["celery", "inline"]
    )
    parser.add_argument(
        "--brokers", nargs="+", choices=["redis", "amqp"], default=["redis"], help=BROKERS_HELP
    )
    parser.add_argument("--rabbitmq-url", help="a RabbitMQ to use (default: a node of its own)")
    parser.add_argument(
        "--runs", type=int, default=3, help="rounds, each every run and the baselines (median)"
    )
    parser.add_argument("--record", metavar="CONDITIONS", help=RECORD_HELP)
    args = parser.parse_args()
    if args.runs < 1:
        parser.error("--runs must be at least 1")
    if args.start == "api" and args.record is not None:
        parser.error("--record records the stored machines' figure: not with --start api")
    workers = {"concurrency": args.concurrency, "pool": args.pool, "workers": args.workers}
    amqp = Broker(args.rabbitmq_url) if "amqp" in args.brokers else None
    rounds = []
    try:
        for _ in range(args.runs):  # the project and the chains alternate: drift falls alike
            txn = run_transaction_baseline()
            for name in args.brokers:
                broker = amqp if name == "amqp" else None
                rounds.append(Round(*_round(args, workers, broker), txn, name))
    finally:
        if amqp is not None:
            amqp.stop()
    _report(args, rounds)
    path = write_result(
        "throughput",
        {"rounds": [asdict(rnd) for rnd in rounds], "pg_url": PG_URL},
    )
    print(f"written {path}")


if __name__ == "__main__":
    main()
