"""What Prometheus metrics cost: inline and celery throughput (bench.throughput's run_engine)
with metrics on (FSM_METRICS_PORT set: every process counts, the worker and the bridge serve
/metrics) and off, rounds alternating off and on so that a drift of the machine spreads over
both; the median of each, and on's change against off.

    .venv/bin/python -m bench.metrics_overhead [--machines 200] [--seconds 10] [--runs 3]
        [--modes inline celery]

Target (issue 40): on within 3% of off. Several processes of one deployment share the one
port here (the first worker and the bridge serve it, the second worker logs that it cannot):
what is measured is the counting, which every process does all the same.
"""

from __future__ import annotations

import argparse
import statistics
from typing import Any

from bench.common import write_result
from bench.throughput import run_engine
from tests.support.scrape import free_port


def measure(mode: str, machines: int, seconds: float, runs: int) -> dict[str, Any]:
    """The rounds of one mode: off then on, `runs` times; each a sustained transitions/s."""
    rates: dict[str, list[float]] = {"off": [], "on": []}
    for n in range(runs):
        for label in ("off", "on") if n % 2 == 0 else ("on", "off"):
            port = free_port() if label == "on" else 0
            result = run_engine(machines, seconds=seconds, mode=mode, metrics_port=port)
            rates[label].append(result["sustained_per_s"])
            print(f"  {mode} round {n + 1} metrics {label}: {result['sustained_per_s']}/s")
    off, on = statistics.median(rates["off"]), statistics.median(rates["on"])
    return {
        "mode": mode,
        "machines": machines,
        "seconds": seconds,
        "runs": rates,
        "median_off_per_s": off,
        "median_on_per_s": on,
        "change_percent": round((on - off) / off * 100, 2) if off else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--machines", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--modes", nargs="+", default=["inline", "celery"])
    args = parser.parse_args()
    results = []
    for mode in args.modes:
        found = measure(mode, args.machines, args.seconds, args.runs)
        results.append(found)
        print(
            f"{mode}: off {found['median_off_per_s']}/s, on {found['median_on_per_s']}/s "
            f"(median of {args.runs}): {found['change_percent']:+}%"
        )
    write_result("metrics_overhead", {"results": results})


if __name__ == "__main__":
    main()
