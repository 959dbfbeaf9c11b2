"""What PgBouncer's transaction pooling costs: bench.throughput's figure (machines looping
through two states, an agent that answers at once) with the processes on PostgreSQL directly,
the hot statements prepared per session, and through a PgBouncer in transaction mode
(Debian's pgbouncer, started here in front of the same server), the statements sent whole
(FSM_DATABASE_PREPARE=false); both transition modes, the two alternating in each round.

    .venv/bin/python -m bench.pgbouncer [--machines 1000] [--seconds 10] [--runs 3]
        [--modes celery inline] [--pool-size 20]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.common import PG_URL
from bench.throughput import run_engine
from tests.support.pgbouncer import PgBouncer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", type=int, default=1000)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["celery", "inline"])
    parser.add_argument("--pool-size", type=int, default=20)
    args = parser.parse_args()
    bouncer = PgBouncer.start(Path(tempfile.mkdtemp(prefix="bench-pgb-")), PG_URL, args.pool_size)
    try:
        for mode in args.modes:
            ratios, direct, bounced = [], [], []
            for _ in range(args.runs):
                a = run_engine(args.machines, seconds=args.seconds, mode=mode)
                b = run_engine(
                    args.machines,
                    seconds=args.seconds,
                    mode=mode,
                    pg_url=bouncer.url,
                    database_prepare=False,
                )
                direct.append(a["sustained_per_s"])
                bounced.append(b["sustained_per_s"])
                ratios.append(b["sustained_per_s"] / a["sustained_per_s"])
                print(
                    f"{mode}: direct {a['sustained_per_s']}/s, pgbouncer {b['sustained_per_s']}/s"
                )
            print(_summary(mode, direct, bounced, ratios))
    finally:
        bouncer.stop()


def _summary(mode: str, direct: list[float], bounced: list[float], ratios: list[float]) -> str:
    def spread(values: list[Any]) -> str:
        return f"{statistics.median(values):.0f} ({min(values):.0f}-{max(values):.0f})"

    return (
        f"{mode}: direct {spread(direct)} transitions/s, through PgBouncer (transaction mode, "
        f"unprepared) {spread(bounced)}; ratio median {statistics.median(ratios):.2f} "
        f"({min(ratios):.2f}-{max(ratios):.2f})"
    )


if __name__ == "__main__":
    main()
