"""History at scale: the monthly partitions of state_transitions holding 10,000,000 rows over 12
months, and what they cost the hot path: throughput beside an empty database, a machine's
history and the lists read, and the locks retention takes while transitions go on.

    .venv/bin/python -m bench.history [--history 10000000] [--months 12] [--per-machine 10]
        [--machines 1000] [--modes inline celery] [--runs 1] [--samples 2000]
        [--skip-throughput] [--keep-dataset | --dataset NAME] [--record CONDITIONS]

The dataset is made once. A deployment's database is filled with set-based SQL (generate_series,
as bench/scale.py does): `--history` rows, `--per-machine` per machine, so history/per-machine
finished machines (status completed, type bench_chain, agent type bench), created evenly over
the `--months` whole UTC months before the current one (their partitions made first with
store.partitions.ensure), each ended a few minutes after it began. Each of its rows is an ack
(attempt 1..per-machine, S00 -> S01 ... S09 -> DONE) a little after its machine's creation, with
a ~100-byte output, `{}` as its context change, an agent of 16, and machine_created_at its
machine's created_at; rows are inserted in the order of their own times, so ids grow with time
and a machine's rows lie among those of the machines beside it, as a live database has them.
Then VACUUM ANALYZE (autovacuum's work, off on this server), and the statistics' fold run to
the end (bench.scale.fold_all: the finished machines' counts and every attempt folded, as beat
would long since have done; its seconds printed), so retention finds the months folded. That
database is kept as a template (its sessions closed): every run that wants the full database
gets a copy of it, `CREATE DATABASE ... TEMPLATE ... STRATEGY = FILE_COPY` (a copy of the
files, seconds where the fill takes minutes), made over the deployment's own database in
run_engine's prefill, before its processes start; the copy's seconds are printed.

1. Throughput (bench.throughput.run_engine, as bench/scale.py): in each mode, each round, a run
   on an empty database and one on a copy of the full one; the ratio full/empty within a round,
   then the median of the rounds and their spread. Target: within 15%.
2. Reads, on a copy with no process running: `--samples` calls each of client.history() of a
   random finished machine (ids drawn beforehand), and of client.list_machines(limit=50), with
   the filters bench/scale.py times; p50/p95/p99/max in ms. Targets: history p99 <= 10 ms,
   each list's p99 <= 20 ms. Twenty calls of each are made first, not counted (the pool's
   connections, the prepared statements); the data is not warmed otherwise.
3. Retention, on the same copy: a writer (a client of its own) starts bench_chain machines at
   `--writer-rate` a second (each a machine row and its history row, in the current month's
   partition, in one transaction, then its first state enqueued: nothing consumes it here);
   its statements are timed (SQLAlchemy's cursor events) for `--writer-seconds` alone (the
   baseline), then while client.archive_history(retention_days= so that the `--expire` oldest
   months are past it, archive="") runs; meanwhile pg_locks is sampled every ~2 ms by a process
   of its own (not sharing the writer's interpreter lock). Printed: the writer's longest
   statement during the run beside its baseline p99, the longest a lock conflicting with ROW
   EXCLUSIVE (SHARE, SHARE ROW EXCLUSIVE, EXCLUSIVE, ACCESS EXCLUSIVE) was seen held on
   state_transitions (the parent) or state_machines, and the longest any session was seen
   waiting for a lock on those or on a month of the history. Target: <= 100 ms. A lock seen
   in one sample only is counted 0 ms: each figure is the span between its first and last
   sample.
"""

from __future__ import annotations

import argparse
import multiprocessing
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import create_engine, event, text
from sqlalchemy.pool import NullPool

from bench import figures
from bench.common import (
    PG_URL,
    RECORD_HELP,
    deployment,
    record_current,
    tear_down,
    write_result,
)
from bench.scale import Round, fold_all, quote, summary
from bench.throughput import run_engine
from fsm_celery import wiring
from fsm_celery.store import partitions
from tests.support.databases import admin_sql, drop_database
from tests.support.processes import FsmEnv, database_name

STEP_S = 20  # seconds between a machine's history rows
AGENTS = 16  # the agents the history's rows name
CONFLICTING = ("ShareLock", "ShareRowExclusiveLock", "ExclusiveLock", "AccessExclusiveLock")
HISTORY_TARGET_MS, LIST_TARGET_MS, LOCK_TARGET_MS, RATIO_TARGET = 10.0, 20.0, 100.0, 0.85
WARM_UP = 20  # calls of each read made first, not counted


# --- the dataset -------------------------------------------------------------------------------


def span(months: int, now: datetime) -> tuple[datetime, datetime]:
    """The first instant of the months before now's, and the first of now's."""
    end = partitions.month(now)
    first = end
    for _ in range(months):
        first = (first - timedelta(days=1)).replace(day=1)
    return first, end


MACHINES_SQL = """
INSERT INTO state_machines (id, type, agent_type, current_state, context, status,
    definition_version, agent_id, attempt, tokens_used, cost, entered_at, created_at, updated_at)
SELECT md5('bench-history-' || i)::uuid, 'bench_chain', 'bench', 'DONE', '{}'::jsonb,
    'completed', :version, md5('bench-agent-' || (i % :agents))::uuid, :per, :per * 500,
    :per * 0.002, c + (:per * :step + 30) * interval '1 second', c,
    c + (:per * :step + 30) * interval '1 second'
FROM (SELECT i, CAST(:first AS timestamptz) + (i + 0.5) * :spacing * interval '1 second' AS c
      FROM generate_series(:lo, :hi) i) m
"""

HISTORY_SQL = """
INSERT INTO state_transitions (machine_id, from_state, to_state, success, output, duration_ms,
    created_at, attempt, event, agent_id, tokens_used, cost, context_delta, machine_created_at)
SELECT md5('bench-history-' || i)::uuid,
    'S' || lpad(((g - 1) % 10)::text, 2, '0'),
    CASE WHEN g = :per THEN 'DONE' ELSE 'S' || lpad((g % 10)::text, 2, '0') END,
    true,
    jsonb_build_object('ok', true, 'summary', format(
        'step %s of %s: wrote %s lines in %s files, all checks passed', g, :per,
        (i * 7 + g * 13) % 500, 1 + (i + g) % 9), 'tokens', 100 + (i * 31 + g * 17) % 900),
    1000 + (i * 37 + g * 11) % 5000,
    c + g * :step * interval '1 second', g, 'ack', md5('bench-agent-' || (i % :agents))::uuid,
    100 + (i * 31 + g * 17) % 900, 0.002, '{}'::jsonb, c
FROM (SELECT i, CAST(:first AS timestamptz) + (i + 0.5) * :spacing * interval '1 second' AS c
      FROM generate_series(:lo, :hi) i) m
CROSS JOIN generate_series(1, :per) g
ORDER BY c + g * :step * interval '1 second', i
"""


def build_dataset(history: int, months: int, per: int) -> tuple[str, dict[str, Any]]:
    """A deployment's database filled with the dataset, vacuumed and folded, its sessions
    closed: the database's name (a template for copies) and what it took."""
    env = deployment("histdata")
    name = database_name(env)
    try:
        took = fill(env, history, months, per)
    except BaseException:
        tear_down(env)
        raise
    env.stop_all()
    env.client.engine.db.dispose()
    return name, took


def fill(env: FsmEnv, history: int, months: int, per: int) -> dict[str, Any]:
    db = env.client.engine.db
    machines = max(history // per, 1)
    first, end = span(months, datetime.now(UTC))
    spacing = (end - first).total_seconds() / machines
    t0 = time.monotonic()
    made = partitions.ensure(db, partitions.HISTORY, first, end - timedelta(seconds=1))
    with db.connect() as conn:
        version = conn.execute(
            text("SELECT max(version) FROM state_machine_definitions WHERE type = 'bench_chain'")
        ).scalar_one()
    print(f"dataset: {len(made)} months made ({first:%Y-%m} to {end - timedelta(days=1):%Y-%m})")
    chunk = max(100_000 // per, 1) * 10  # a million history rows a statement at most
    chunk = min(chunk, machines)
    params = {
        "version": version,
        "agents": AGENTS,
        "per": per,
        "step": STEP_S,
        "first": first,
        "spacing": spacing,
    }
    for lo in range(0, machines, chunk):
        hi = min(lo + chunk, machines) - 1
        with db.begin() as conn:
            conn.execute(text("SET LOCAL work_mem = '256MB'"))
            conn.execute(text(MACHINES_SQL), {**params, "lo": lo, "hi": hi})
            conn.execute(text(HISTORY_SQL), {**params, "lo": lo, "hi": hi})
        rows = (hi + 1) * per
        print(
            f"  {rows:>12,} of {machines * per:,} rows  {time.monotonic() - t0:8.1f} s",
            flush=True,
        )
    inserted = round(time.monotonic() - t0, 1)
    t1 = time.monotonic()
    with db.connect() as conn:
        conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
    vacuumed = round(time.monotonic() - t1, 1)
    folded = fold_all(env, timeout=7200.0)
    with db.connect() as conn:
        size = conn.execute(
            text("SELECT pg_database_size(current_database()), count(*) FROM state_machines")
        ).one()
        per_month = conn.execute(
            text(
                "SELECT c.relname, c.reltuples::bigint FROM pg_inherits i"
                " JOIN pg_class c ON c.oid = i.inhrelid"
                " WHERE i.inhparent = 'state_transitions'::regclass ORDER BY c.relname"
            )
        ).all()
    held = {r.relname: int(r.reltuples) for r in per_month if r.reltuples > 0}
    print(
        f"dataset: {machines * per:,} rows, {size[1]:,} machines, {size[0] / 2**30:.2f} GiB;"
        f" inserted in {inserted} s, VACUUM ANALYZE {vacuumed} s, statistics folded in"
        f" {folded['seconds']} s ({folded['attempts']:,} attempts, bench.scale.fold_all)"
    )
    print("  rows by month: " + ", ".join(f"{k[-7:]} {v:,}" for k, v in held.items()))
    return {
        "rows": machines * per,
        "machines": machines,
        "bytes": int(size[0]),
        "insert_s": inserted,
        "vacuum_analyze_s": vacuumed,
        "fold_s": folded["seconds"],
        "rows_by_month": held,
    }


def copy_into(dataset: str, copies: list[float]) -> Callable[[FsmEnv], None]:
    """A prefill that replaces the deployment's database with a copy of the dataset's (before
    any of its processes start), the seconds it took appended to `copies`."""

    def prefill(env: FsmEnv) -> None:
        t0 = time.monotonic()
        env.client.engine.db.dispose()
        name = database_name(env)
        drop_database(PG_URL, name)
        admin_sql(PG_URL, f'CREATE DATABASE "{name}" TEMPLATE "{dataset}" STRATEGY = FILE_COPY')
        copies.append(round(time.monotonic() - t0, 2))

    return prefill


# --- reads -------------------------------------------------------------------------------------


def percentiles(ms: list[float]) -> dict[str, float]:
    ordered = sorted(ms)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {
        "p50": at(0.50),
        "p95": at(0.95),
        "p99": at(0.99),
        "max": round(ordered[-1], 2),
        "n": len(ordered),
    }


def sample(fn: Callable[[int], object], count: int) -> dict[str, float]:
    for n in range(WARM_UP):  # other arguments than those timed
        fn(count + n)
    ms = []
    for n in range(count):
        t0 = time.perf_counter()
        fn(n)
        ms.append((time.perf_counter() - t0) * 1000)
    return percentiles(ms)


def reads(env: FsmEnv, samples: int) -> dict[str, dict[str, float]]:
    client = env.client
    with client.engine.db.connect() as conn:
        ids = list(
            conn.execute(
                text(
                    "SELECT id FROM state_machines WHERE status = 'completed'"
                    " ORDER BY random() LIMIT :n"
                ),
                {"n": samples + WARM_UP},
            ).scalars()
        )
    got = len(client.history(ids[0]))
    print(f"\nreads ({samples:,} calls each; a history holds {got} rows)")
    lists: dict[str, Callable[[int], object]] = {
        "list": lambda _: client.list_machines(limit=50),
        "list_completed": lambda _: client.list_machines(status="completed", limit=50),
        "list_running": lambda _: client.list_machines(status="running", limit=50),
        "list_by_type": lambda _: client.list_machines(machine_type="bench_chain", limit=50),
        "list_by_agent_type": lambda _: client.list_machines(
            agent_type="bench", status="completed", limit=50
        ),
    }
    found = {"history": sample(lambda n: client.history(ids[n % len(ids)]), samples)}
    for name, fn in lists.items():
        found[name] = sample(fn, samples)
    print(f"{'':>20} {'p50':>8} {'p95':>8} {'p99':>8} {'max':>8}  ms")
    for name, p in found.items():
        target = HISTORY_TARGET_MS if name == "history" else LIST_TARGET_MS
        verdict = "ok" if p["p99"] <= target else "OVER"
        print(
            f"{name:>20} {p['p50']:>8} {p['p95']:>8} {p['p99']:>8} {p['max']:>8}"
            f"  (p99 target <= {target:g} ms: {verdict})"
        )
    return found


# --- retention under load ----------------------------------------------------------------------


class Writer:
    """A client of its own starting bench_chain machines at a steady rate; each of its
    statements timed (start time, ms)."""

    def __init__(self, env: FsmEnv, rate: float) -> None:
        self.client = wiring.client(env.settings)
        self.rate = rate
        self.statements: list[tuple[float, float]] = []
        self.calls: list[tuple[float, float]] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="writer", daemon=True)
        db = self.client.engine.db
        event.listen(db, "before_cursor_execute", self._before)
        event.listen(db, "after_cursor_execute", self._after)

    def _before(self, conn: Any, *_: object) -> None:
        conn.info["bench_t0"] = time.perf_counter()

    def _after(self, conn: Any, *_: object) -> None:
        t0 = conn.info.pop("bench_t0", None)
        if t0 is not None:
            self.statements.append((t0, (time.perf_counter() - t0) * 1000))

    def _run(self) -> None:
        period = 1.0 / self.rate if self.rate > 0 else 0.0
        due = time.perf_counter()
        while not self._stop.is_set():
            t0 = time.perf_counter()
            try:
                self.client.start_machine("bench_chain", {})
            except Exception as error:  # recorded, and the load goes on
                self.errors.append(str(error).splitlines()[0])
            self.calls.append((t0, (time.perf_counter() - t0) * 1000))
            due += period
            pause = due - time.perf_counter()
            if pause > 0:
                time.sleep(pause)
            else:
                due = time.perf_counter()  # behind: no burst to catch up

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=60)
        self.client.engine.db.dispose()

    def between(self, t0: float, t1: float) -> tuple[list[float], list[float]]:
        """The statements' and the calls' ms of those that ran (in part) between t0 and t1."""
        statements = [ms for at, ms in list(self.statements) if at <= t1 and at + ms / 1000 >= t0]
        calls = [ms for at, ms in list(self.calls) if at <= t1 and at + ms / 1000 >= t0]
        return statements, calls


LOCKS_SQL = (
    "SELECT clock_timestamp(), l.pid, l.virtualtransaction, l.relation, l.mode, l.granted"
    " FROM pg_locks l WHERE l.locktype = 'relation' AND l.relation = ANY(%s::oid[])"
    " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
)
Seen = dict[tuple[int, str, int, str, bool], list[datetime]]


def sample_locks(url: str, watched: list[int], interval: float, stop: Any, out: Any) -> None:
    """The sampler's process: pg_locks every `interval` seconds until `stop` is set, then
    sends (the locks seen with their first and last times, the samples taken, seconds)."""
    db = create_engine(url, poolclass=NullPool)
    seen: Seen = {}
    samples = 0
    with db.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        cursor = conn.connection.cursor()  # the driver's: no overhead per sample
        out.send("ready")
        t_start = time.perf_counter()
        while not stop.is_set():
            t0 = time.perf_counter()
            cursor.execute(LOCKS_SQL, (watched,))
            for at, pid, vxid, relation, mode, granted in cursor.fetchall():
                key = (pid, vxid, int(relation), mode, bool(granted))
                times = seen.setdefault(key, [at, at])
                times[1] = at
            samples += 1
            pause = interval - (time.perf_counter() - t0)
            if pause > 0:
                time.sleep(pause)
        seconds = time.perf_counter() - t_start
    db.dispose()
    out.send((seen, samples, seconds))


class LockSampler:
    """pg_locks sampled every `interval` seconds by a process of its own (no share of this
    one's interpreter lock, which the writer's thread needs): for each lock on a watched table
    (by session, transaction, table, mode and whether granted), the server's time it was first
    and last seen."""

    def __init__(self, url: str, interval: float = 0.002) -> None:
        self.interval = interval
        self.seen: Seen = {}
        self.samples = 0
        self.seconds = 0.0
        db = create_engine(url, poolclass=NullPool)
        with db.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT c.oid, c.relname FROM pg_class c WHERE c.oid IN ("
                    " 'state_transitions'::regclass, 'state_machines'::regclass)"
                    " OR c.oid IN (SELECT inhrelid FROM pg_inherits"
                    "  WHERE inhparent = 'state_transitions'::regclass)"
                )
            ).all()
        db.dispose()
        self.names = {int(r.oid): str(r.relname) for r in rows}
        self.parent = next(o for o, n in self.names.items() if n == partitions.HISTORY)
        self.machines = next(o for o, n in self.names.items() if n == "state_machines")
        context = multiprocessing.get_context("spawn")
        self._stop = context.Event()
        self._results, sender = context.Pipe(duplex=False)
        self._process = context.Process(
            target=sample_locks,
            args=(url, list(self.names), interval, self._stop, sender),
            name="pg_locks",
            daemon=True,
        )

    def start(self) -> None:
        self._process.start()
        if not self._results.poll(60) or self._results.recv() != "ready":
            raise RuntimeError("the pg_locks sampler did not start")

    def stop(self) -> None:
        self._stop.set()
        if self._results.poll(60):
            self.seen, self.samples, self.seconds = self._results.recv()
        self._process.join(timeout=30)

    def longest(self, pick: Callable[[int, str, bool], bool]) -> dict[str, Any]:
        """The lock picked (by table oid, mode, granted) seen the longest: its ms and what."""
        best: dict[str, Any] = {"ms": 0.0, "lock": None}
        for (pid, _, relation, mode, granted), (first, last) in self.seen.items():
            if not pick(relation, mode, granted):
                continue
            ms = (last - first).total_seconds() * 1000
            if best["lock"] is None or ms > best["ms"]:
                table = self.names.get(relation, str(relation))
                best = {"ms": round(ms, 1), "lock": f"{mode} on {table} by pid {pid}"}
        return best

    @property
    def interval_ms(self) -> float:
        return round(self.seconds * 1000 / max(self.samples, 1), 2)


@contextmanager
def running(*parts: Writer | LockSampler) -> Iterator[None]:
    with ExitStack() as stack:  # each started one stopped, the last first
        for part in parts:
            part.start()
            stack.callback(part.stop)
        yield


def retention(env: FsmEnv, expire: int, rate: float, baseline_s: float) -> dict[str, Any]:
    """Retention run while a writer starts machines: its locks and the writer's waits."""
    now = datetime.now(UTC)
    months = {p.name: p for p in env.client.history_months()[partitions.HISTORY]}
    filled = sorted(p for p, m in months.items() if m.rows > 0)
    if len(filled) <= expire:
        raise RuntimeError(f"{len(filled)} months hold rows: cannot expire {expire} of them")
    # Past the cutoff: the months that end before it (partitions' end <= cutoff).
    oldest = months[filled[0]].start
    cutoff = oldest
    for _ in range(expire):
        cutoff = partitions.next_month(cutoff)
    cutoff += timedelta(days=1)
    days = round((now - cutoff).total_seconds() / 86400, 3)
    writer = Writer(env, rate)
    sampler = LockSampler(env.settings.database_url)
    print(
        f"\nretention (retention_days={days}, archive=''; a writer starting "
        f"{rate:g} machines/s, pg_locks sampled every {sampler.interval * 1000:g} ms)"
    )
    with running(sampler, writer):  # the sampler first: its process takes a while to start
        base0 = time.perf_counter()
        time.sleep(baseline_s)
        base_statements, base_calls = writer.between(base0, time.perf_counter())
        t0 = time.perf_counter()
        outcomes = env.client.archive_history(retention_days=days, archive="")
        t1 = time.perf_counter()
        time.sleep(0.5)
    during, calls = writer.between(t0, t1)
    removed = [o for o in outcomes if o.action in ("dropped", "archived", "kept")]
    others = [o for o in outcomes if o not in removed]
    base = percentiles(base_statements)
    base_call = percentiles(base_calls)
    hot = (sampler.parent, sampler.machines)
    held = sampler.longest(
        lambda rel, mode, granted: granted and rel in hot and mode in CONFLICTING
    )
    waited = sampler.longest(lambda rel, mode, granted: not granted)
    detach_held = sampler.longest(
        lambda rel, mode, granted: granted and rel == sampler.parent and mode != "RowExclusiveLock"
    )
    result: dict[str, Any] = {
        "retention_days": days,
        "seconds": round(t1 - t0, 2),
        "months_removed": [o.month for o in removed],
        "outcomes": [o.line() for o in outcomes],
        "writer_rate_per_s": rate,
        "writer_baseline_ms": {"statement": base, "call": base_call},
        "writer_during_ms": {
            "statement": percentiles(during) if during else None,
            "call": percentiles(calls) if calls else None,
        },
        "writer_errors": writer.errors[:10],
        "conflicting_lock_held": held,
        "lock_waited": waited,
        "parent_lock_held_other_than_row_exclusive": detach_held,
        "lock_samples": sampler.samples,
        "lock_sample_interval_ms": sampler.interval_ms,
    }
    for outcome in others:
        print(f"  {outcome.line()}")
    print(
        f"  removed {len(removed)} month(s) ({', '.join(result['months_removed']) or 'none'})"
        f" in {result['seconds']} s"
    )
    longest_statement = max(during, default=0.0)
    longest_call = max(calls, default=0.0)
    print(
        f"  writer: baseline statement p99 {base['p99']} ms (max {base['max']}; call p99 "
        f"{base_call['p99']} ms), over {baseline_s:g} s: {base['n']:,} statements,"
        f" {base_call['n']:,} machines started ({base_call['n'] / baseline_s:.0f}/s)"
    )
    print(
        f"  writer during the run: longest statement {longest_statement:.1f} ms, longest call"
        f" {longest_call:.1f} ms, {len(during):,} statements"
        f"  (target <= {LOCK_TARGET_MS:g} ms: {_verdict(longest_statement)})"
    )
    print(
        f"  longest lock held in a mode conflicting with ROW EXCLUSIVE on state_transitions or"
        f" state_machines: {held['ms']} ms ({held['lock'] or 'none seen'})"
        f"  (target <= {LOCK_TARGET_MS:g} ms: {_verdict(held['ms'])})"
    )
    print(
        f"  longest wait for a lock on them or a month of the history: {waited['ms']} ms"
        f" ({waited['lock'] or 'none seen'})  (target <= {LOCK_TARGET_MS:g} ms:"
        f" {_verdict(waited['ms'])})"
    )
    print(
        f"  (the parent's other locks, none conflicting: longest {detach_held['ms']} ms,"
        f" {detach_held['lock'] or 'none seen'}; {sampler.samples:,} samples of pg_locks, one"
        f" every {sampler.interval_ms} ms)"
    )
    if writer.errors:
        print(f"  the writer's errors ({len(writer.errors)}): {writer.errors[0]}")
    result["writer_longest_statement_ms"] = round(longest_statement, 1)
    result["writer_longest_call_ms"] = round(longest_call, 1)
    return result


def _verdict(ms: float) -> str:
    return "ok" if ms <= LOCK_TARGET_MS else "OVER"


# --- the run -----------------------------------------------------------------------------------


def throughput(
    dataset: str, machines: int, modes: list[str], runs: int, copies: list[float]
) -> dict[str, dict[str, Any]]:
    print(f"\n{'mode':>8} {'run':>4} {'empty: sustained/s':>20} {'full: sustained/s':>20}")
    rounds: dict[str, list[Round]] = {m: [] for m in modes}
    for n in range(1, runs + 1):
        for mode in modes:
            empty = run_engine(machines, mode=mode)
            full = run_engine(machines, prefill=copy_into(dataset, copies), mode=mode)
            full["copy_s"] = copies[-1]
            ratio = full["sustained_per_s"] / empty["sustained_per_s"]
            rounds[mode].append((empty, full, ratio))
            print(
                f"{mode:>8} {n:>4} {empty['sustained_per_s']:>20} {full['sustained_per_s']:>20}"
                f"   ({ratio:.0%} of empty; the database copied in {copies[-1]} s first)",
                flush=True,
            )
    found: dict[str, dict[str, Any]] = {}
    for mode, taken in rounds.items():
        found[mode] = summary(taken)
        low, high = found[mode]["ratio_spread"]
        verdict = "ok" if found[mode]["ratio"] >= RATIO_TARGET else "OVER"
        print(
            f"{mode:>8} median of {len(taken)}: {found[mode]['ratio']:.0%} of empty "
            f"({low:.0%}-{high:.0%})  (target: within 15%: {verdict})"
        )
    return found


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--history", type=int, default=10_000_000, help="history rows")
    parser.add_argument("--months", type=int, default=12, help="months they are spread over")
    parser.add_argument("--per-machine", type=int, default=10, help="history rows per machine")
    parser.add_argument("--machines", type=int, default=1000, help="run_engine's machines")
    parser.add_argument(
        "--modes", nargs="+", choices=["inline", "celery"], default=["inline", "celery"]
    )
    parser.add_argument("--runs", type=int, default=1, help="throughput rounds (median)")
    parser.add_argument("--samples", type=int, default=2000, help="calls of each read timed")
    parser.add_argument("--expire", type=int, default=2, help="the oldest months retention removes")
    parser.add_argument("--writer-rate", type=float, default=100.0, help="machines/s (0: flat out)")
    parser.add_argument("--writer-seconds", type=float, default=5.0, help="the writer's baseline")
    parser.add_argument("--skip-throughput", action="store_true", help="reads and retention only")
    parser.add_argument(
        "--keep-dataset", action="store_true", help="keep the dataset's database (its name printed)"
    )
    parser.add_argument(
        "--dataset", metavar="NAME", help="a dataset kept by an earlier run (made the same day)"
    )
    parser.add_argument("--record", metavar="CONDITIONS", help=RECORD_HELP)
    args = parser.parse_args()
    if args.runs < 1 or args.months < 1 or args.per_machine < 1 or args.history < args.per_machine:
        parser.error("--runs, --months and --per-machine must be positive, --history >= per")
    if not 0 < args.expire < args.months:
        parser.error("--expire must be between 1 and --months - 1")
    if args.record is not None and "history" not in figures.FIGURE_KEYS:
        parser.error("bench/figures.py has no 'history' row yet: --record would fail at the end")
    t_start = time.monotonic()
    phases: dict[str, float] = {}
    t0 = time.monotonic()
    if args.dataset is not None:
        dataset, built = args.dataset, {"reused": args.dataset}
    else:
        dataset, built = build_dataset(args.history, args.months, args.per_machine)
    phases["dataset_s"] = round(time.monotonic() - t0, 1)
    copies: list[float] = []
    modes: dict[str, dict[str, Any]] = {}
    try:
        if not args.skip_throughput:
            t0 = time.monotonic()
            modes = throughput(dataset, args.machines, args.modes, args.runs, copies)
            phases["throughput_s"] = round(time.monotonic() - t0, 1)
        t0 = time.monotonic()
        env = deployment("histread")
        try:
            copy_into(dataset, copies)(env)
            print(f"\nthe full database copied in {copies[-1]} s for the reads and retention")
            read_ms = reads(env, args.samples)
            phases["reads_s"] = round(time.monotonic() - t0, 1)
            t0 = time.monotonic()
            kept = retention(env, args.expire, args.writer_rate, args.writer_seconds)
            phases["retention_s"] = round(time.monotonic() - t0, 1)
        finally:
            tear_down(env)
    finally:
        if args.keep_dataset or args.dataset is not None:
            print(f"the dataset is kept: --dataset {dataset}")
        else:
            drop_database(PG_URL, dataset)
    phases["total_s"] = round(time.monotonic() - t_start, 1)
    lists = {k: v for k, v in read_ms.items() if k.startswith("list")}
    list_p99 = max(p["p99"] for p in lists.values())
    print(
        f"\nhistory p99 {read_ms['history']['p99']} ms (target <= {HISTORY_TARGET_MS:g}); "
        f"lists' p99 at most {list_p99} ms (target <= {LIST_TARGET_MS:g}); "
        f"phases: {', '.join(f'{k} {v}' for k, v in phases.items())}"
    )
    size = {
        "history": args.history,
        "months": args.months,
        "per_machine": args.per_machine,
        "machines": args.machines,
    }
    path = write_result(
        "history",
        {
            **size,
            "dataset": built,
            "copy_s": copies,
            "modes": modes,
            "read_ms": read_ms,
            "list_p99_ms": list_p99,
            "retention": kept,
            "phases_s": phases,
        },
    )
    print(f"written {path}")
    if args.record is not None:
        quoted = {mode: quote(run) for mode, run in modes.items()}
        row = {
            **size,
            "modes": quoted,
            "history_p99_ms": read_ms["history"]["p99"],
            "list_p99_ms": list_p99,
            "read_ms": {name: p["p99"] for name, p in read_ms.items()},
            "retention_longest_statement_ms": kept["writer_longest_statement_ms"],
            "retention_lock_held_ms": kept["conflicting_lock_held"]["ms"],
            "retention_lock_waited_ms": kept["lock_waited"]["ms"],
            "retention_months_removed": len(kept["months_removed"]),
        }
        print(f"recorded {record_current('history', row, args.record)}")


if __name__ == "__main__":
    main()
