"""Scale: throughput with 100,000 finished machines and 1,000,000 history rows already stored,
beside the same run on an empty database, in each transition mode; the scan's time and the
API's list queries' times.

    .venv/bin/python -m bench.scale [--finished 100000] [--history 1000000] [--machines 1000]
                                    [--modes inline celery] [--runs 3]

The stored history is vacuumed and folded into the statistics' counters before the run, as
autovacuum and beat's fold would long since have done to a database that holds it; how long
that fold took (catching up on a million rows at once: an upgrade to the statistics, or beat
stopped for days) is printed beside the run. Each round runs the empty database and then the
full one, in each mode; the ratio is taken within a round, before the median of the rounds.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import text

from bench.common import (
    RECORD_HELP,
    FsmEnv,
    deployment,
    record_current,
    tear_down,
    write_result,
)
from bench.throughput import run_engine
from fsm_celery.store import partitions


def fill(
    finished: int, history: int, folds: list[float] | None = None, *, fold: bool = True
) -> Callable[[FsmEnv], None]:
    """A prefill that stores finished machines and their history with set-based SQL, then
    vacuums it and (unless fold is false) folds it into the statistics' counters, the seconds
    the fold took appended to `folds`."""

    def prefill(env: FsmEnv) -> None:
        per = max(history // finished, 1)
        now = datetime.now(UTC)  # the months of the machines made below have their partitions
        partitions.ensure(
            env.client.engine.db, partitions.HISTORY, now - timedelta(seconds=finished), now
        )
        with env.client.engine.db.begin() as conn:
            conn.execute(
                text("""
                INSERT INTO state_machines (id, type, agent_type, current_state, context, status,
                    definition_version, attempt, created_at, updated_at)
                SELECT gen_random_uuid(), 'bench_chain', 'bench', 'DONE', '{}'::jsonb,
                    'completed', 1, :per + 1, now() - g * interval '1 second',
                    now() - g * interval '1 second'
                FROM generate_series(1, :finished) g"""),
                {"finished": finished, "per": per},
            )
            conn.execute(
                text("""
                INSERT INTO state_transitions (machine_id, from_state, to_state, success,
                    attempt, event, created_at, machine_created_at)
                SELECT m.id, 'S00', 'S01', true, g, 'ack', now() - interval '1 day', m.created_at
                FROM state_machines m CROSS JOIN generate_series(1, :per) g
                WHERE m.status = 'completed'"""),
                {"per": per},
            )
        # What autovacuum would long since have done to a database that holds this history: run
        # now, not in the middle of the measurement (set visibility, hint bits, statistics).
        with env.client.engine.db.connect() as conn:
            conn.execution_options(isolation_level="AUTOCOMMIT").execute(text("VACUUM ANALYZE"))
        if not fold:
            return
        took = fold_all(env)["seconds"]
        if folds is not None:
            folds.append(took)

    return prefill


def fold_all(env: FsmEnv, timeout: float = 600.0) -> dict[str, Any]:
    """Fold every stored history row into the statistics' counters, as beat does a chunk at a
    time (its watermark settles a second after it is noted): the attempts folded, the calls
    and the seconds it took."""
    stats = env.client.engine.stats
    t0 = time.monotonic()
    with env.client.engine.db.connect() as conn:
        last = int(
            conn.execute(text("SELECT coalesce(max(id), 0) FROM state_transitions")).scalar_one()
        )
    folded, calls = 0, 0
    while True:
        folded += stats.fold(most=1000)
        calls += 1
        with env.client.engine.db.connect() as conn:
            through = int(
                conn.execute(text("SELECT coalesce(max(last_id), 0) FROM rollups")).scalar_one()
            )
        seconds = round(time.monotonic() - t0, 2)
        if through >= last:
            return {"attempts": folded, "calls": calls, "seconds": seconds}
        if seconds > timeout:
            raise RuntimeError(f"the statistics folded through {through} of {last} in {timeout}s")
        time.sleep(0.2)


def timed(fn: Any, repeat: int = 20) -> float:
    """Median milliseconds of fn()."""
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1000)
    return round(statistics.median(times), 2)


def queries(finished: int, history: int) -> dict[str, float]:
    env = deployment("scaleq")
    try:
        fill(finished, history)(env)
        client = env.client
        return {
            "scan_ms": timed(lambda: client.engine.scan.run(500)),
            "list_running_ms": timed(lambda: client.list_machines(status="running", limit=50)),
            "list_by_type_ms": timed(
                lambda: client.list_machines(machine_type="bench_chain", limit=50)
            ),
            "list_by_agent_type_ms": timed(
                lambda: client.list_machines(agent_type="bench", status="completed", limit=50)
            ),
            "stats_ms": timed(client.stats, repeat=5),
        }
    finally:
        tear_down(env)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--finished", type=int, default=100_000)
    parser.add_argument("--history", type=int, default=1_000_000)
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--modes", nargs="+", default=["inline", "celery"])
    parser.add_argument("--runs", type=int, default=3, help="rounds (median)")
    parser.add_argument("--record", metavar="CONDITIONS", help=RECORD_HELP)
    args = parser.parse_args()
    size = f"{args.finished:,} machines, {args.history:,} rows"
    runs: dict[str, dict[str, Any]] = {}
    print(f"\n{'mode':>8} {'run':>4} {'empty: sustained/s':>20} {size + ': sustained/s':>44}")
    rounds: dict[str, list[Round]] = {mode: [] for mode in args.modes}
    for n in range(1, args.runs + 1):
        for mode in args.modes:
            folds: list[float] = []
            empty = run_engine(args.machines, mode=mode)
            full = run_engine(
                args.machines, prefill=fill(args.finished, args.history, folds), mode=mode
            )
            full["fold_s"] = folds[0]
            ratio = full["sustained_per_s"] / empty["sustained_per_s"]
            rounds[mode].append((empty, full, ratio))
            print(
                f"{mode:>8} {n:>4} {empty['sustained_per_s']:>20} {full['sustained_per_s']:>36}"
                f"   ({ratio:.0%} of empty; the stored history folded in {folds[0]} s first)"
            )
    for mode, taken in rounds.items():
        runs[mode] = {**summary(taken), "fold_s": _median(f["fold_s"] for _, f, _ in taken)}
        low, high = runs[mode]["ratio_spread"]
        print(
            f"{mode:>8} median of {len(taken)}: {runs[mode]['ratio']:.0%} of empty "
            f"({low:.0%}-{high:.0%})"
        )
    times = queries(args.finished, args.history)
    for name, ms in times.items():
        print(f"{name:>28} {ms:>10} ms")
    path = write_result(
        "scale",
        {"modes": runs, "finished": args.finished, "history": args.history, "query_ms": times},
    )
    print(f"written {path}")
    if args.record is not None:
        quoted = {mode: {**quote(run), "fold_s": run["fold_s"]} for mode, run in runs.items()}
        size = {"finished": args.finished, "history": args.history, "machines": args.machines}
        row = {**size, "modes": quoted, "query_ms": times}
        print(f"recorded {record_current('scale', row, args.record)}")


Round = tuple[dict[str, Any], dict[str, Any], float]  # empty, full, full ÷ empty


def summary(taken: list[Round]) -> dict[str, Any]:
    """A mode's rounds: the medians of each database's rate, the ratio's median (taken within
    each round first) and spread, and every round."""
    ratios = [ratio for _, _, ratio in taken]
    return {
        "empty": {"sustained_per_s": _median(e["sustained_per_s"] for e, _, _ in taken)},
        "full": {"sustained_per_s": _median(f["sustained_per_s"] for _, f, _ in taken)},
        "ratio": round(statistics.median(ratios), 3),
        "ratio_spread": [round(min(ratios), 3), round(max(ratios), 3)],
        "rounds": [{"empty": e, "full": f, "ratio": round(r, 3)} for e, f, r in taken],
    }


def quote(run: dict[str, Any]) -> dict[str, Any]:
    """A mode's summary as the figures' record quotes it."""
    return {
        "empty_per_s": run["empty"]["sustained_per_s"],
        "full_per_s": run["full"]["sustained_per_s"],
        "percent_of_empty": round(run["ratio"] * 100),
        "percent_spread": [round(r * 100) for r in run["ratio_spread"]],
    }


def _median(values: Any) -> float:
    return round(statistics.median(values), 1)


if __name__ == "__main__":
    main()
