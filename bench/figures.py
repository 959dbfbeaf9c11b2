"""The current figures: one table, generated from bench/results/current/*.json, in README.md and
docs/performance.md.

    .venv/bin/python -m bench.figures      # or: make figures

Each file of bench/results/current/ is one benchmark's latest recorded run (a benchmark run with
`--record` writes it, see bench/common.record_current), and one row of the table. The documents
quote no figure but the table's, and tests/unit/test_readme_figures.py fails when the table in
either differs from what these files give, so a figure cannot be changed in one place only.
Older runs and how they came about are in docs/performance-history.md.

This module reads files and formats text only (no database, Redis or benchmark imports), so the
unit tests import it.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CURRENT = ROOT / "bench" / "results" / "current"
DOCUMENTS = (ROOT / "README.md", ROOT / "docs" / "performance.md")
BEGIN, END = "<!-- figures:begin -->\n", "<!-- figures:end -->"
SCHEMA = 1
TIMES = "\N{MULTIPLICATION SIGN}"
DASH = "\N{EN DASH}"

# What every record says about its run, and what each benchmark's figures hold.
RUN_KEYS = ("schema", "benchmark", "date", "commit", "machine", "command", "conditions", "source")
FIGURE_KEYS: dict[str, tuple[str, ...]] = {
    "throughput": ("mode", "machines", "transitions_per_s", "runs", "x_prefork_chain"),
    "latency": ("mode", "machines", "load", "p50_ms", "p99_ms"),
    "scale": ("finished", "history", "machines", "modes"),
    "history": (
        "history",
        "months",
        "machines",
        "modes",
        "history_p99_ms",
        "list_p99_ms",
        "retention_lock_held_ms",
        "retention_lock_waited_ms",
        "retention_longest_statement_ms",
        "retention_months_removed",
    ),
    "memory": ("machines", "worker_waiting_mib", "worker_after_soak_mib", "soak_s"),
    "fanout": ("children", "runs", "seconds", "x_chord", "peak_mib", "after_mib"),
    "dashboard": (
        "finished",
        "history",
        "list_p50_ms",
        "list_p99_ms",
        "machine_p50_ms",
        "stats_p50_ms",
        "pages",
        "engine_loss_pct",
    ),
    "waiting": (
        "waiting",
        "scan_p99_ms",
        "scan_p99_ms_smallest",
        "smallest",
        "redis_bytes_per_waiting",
        "list_p99_ms",
        "stats_p99_ms",
        "approvals_p99_ms",
        "starts_vs_empty",
        "restart_s",
        "worker_mib",
        "worker_mib_smallest",
    ),
}
# The table's rows: one file each, in this order; a file not named here is refused.
ROWS = (
    "throughput-inline",
    "throughput-celery",
    "throughput-celery-amqp",
    "fanout",
    "latency-inline",
    "latency-celery",
    "scale",
    "history",
    "memory",
    "dashboard",
    "waiting",
)


Figures = Mapping[str, Any]


@dataclass(frozen=True)
class Target:
    """A figure an issue asked of a row, as the issue put it, and whether the row's figures
    meet it: the table says so beside them, computed from the same file."""

    issue: int
    says: str
    met: Callable[[Figures], bool]


def _flat(f: Figures) -> bool:
    """The scan's p99 at a million waiting within a quarter of its p99 at the smallest level."""
    return bool(f["scan_p99_ms"] <= 1.25 * f["scan_p99_ms_smallest"])


# The targets the issues set (README's table shows each as met or not met). A row without one
# shows a dash.
TARGETS: dict[str, tuple[Target, ...]] = {
    "throughput-inline": (
        Target(
            26,
            f"\N{GREATER-THAN OR EQUAL TO} 15{TIMES} the prefork chain",
            lambda f: f["x_prefork_chain"] >= 15,
        ),
    ),
    "throughput-celery": (
        Target(
            26,
            f"\N{GREATER-THAN OR EQUAL TO} 1{TIMES} the prefork chain",
            lambda f: f["x_prefork_chain"] >= 1,
        ),
    ),
    "fanout": (
        Target(
            42,
            f"inline \N{GREATER-THAN OR EQUAL TO} 5{TIMES} the chord's speed",
            lambda f: f["x_chord"]["inline"] >= 5,
        ),
        Target(
            42,
            f"celery \N{GREATER-THAN OR EQUAL TO} 1{TIMES}",
            lambda f: f["x_chord"]["celery"] >= 1,
        ),
    ),
    "latency-inline": (
        Target(42, "p50 \N{LESS-THAN OR EQUAL TO} 8 ms", lambda f: f["p50_ms"] <= 8),
        Target(42, "p99 \N{LESS-THAN OR EQUAL TO} 25 ms", lambda f: f["p99_ms"] <= 25),
    ),
    "latency-celery": (
        Target(42, "p50 \N{LESS-THAN OR EQUAL TO} 15 ms", lambda f: f["p50_ms"] <= 15),
        Target(42, "p99 \N{LESS-THAN OR EQUAL TO} 35 ms", lambda f: f["p99_ms"] <= 35),
    ),
    "scale": (
        Target(
            26,
            "inline \N{GREATER-THAN OR EQUAL TO} 90%",
            lambda f: f["modes"]["inline"]["percent_of_empty"] >= 90,
        ),
    ),
    "dashboard": (
        Target(
            26,
            "statistics p99 \N{LESS-THAN OR EQUAL TO} 20 ms",
            lambda f: f.get("stats_p99_ms", float("inf")) <= 20,
        ),
    ),
    "waiting": (
        Target(
            42, "the scan p99 \N{LESS-THAN OR EQUAL TO} 50 ms", lambda f: f["scan_p99_ms"] <= 50
        ),
        Target(42, "the scan flat from the smallest level (within 25%)", _flat),
        Target(
            42,
            "lists and statistics p99 \N{LESS-THAN OR EQUAL TO} 50 ms",
            lambda f: max(f["list_p99_ms"], f["stats_p99_ms"], f["approvals_p99_ms"]) <= 50,
        ),
        Target(
            42,
            "starts \N{GREATER-THAN OR EQUAL TO} 90% of an empty database's",
            lambda f: f["starts_vs_empty"] >= 0.9,
        ),
    ),
}


class FigureError(ValueError):
    """A results file that cannot be a row of the table (named, with what is wrong)."""


def check(name: str, record: Mapping[str, Any]) -> None:
    """Refuse a record that lacks what its row shows or says where it came from."""
    missing = [key for key in RUN_KEYS if key not in record]
    if missing:
        raise FigureError(f"{name}.json: missing {', '.join(missing)}")
    if record["schema"] != SCHEMA:
        raise FigureError(f"{name}.json: schema {record['schema']!r}, expected {SCHEMA}")
    benchmark = record["benchmark"]
    if benchmark not in FIGURE_KEYS:
        raise FigureError(f"{name}.json: unknown benchmark {benchmark!r}")
    figures = record.get("figures")
    if not isinstance(figures, dict):
        raise FigureError(f"{name}.json: no figures")
    missing = [key for key in FIGURE_KEYS[benchmark] if figures.get(key) is None]
    if missing:
        raise FigureError(f"{name}.json: {benchmark} figures lack {', '.join(missing)}")
    expected = row_name(benchmark, figures)
    if name != expected:
        raise FigureError(f"{name}.json holds the {expected} figures")
    if not isinstance(record["machine"], dict) or not record["machine"].get("cpus"):
        raise FigureError(f"{name}.json: the machine's cpus are missing")


def row_name(benchmark: str, figures: Mapping[str, Any]) -> str:
    """The file (and row) of a benchmark's figures: by mode, and by broker when Celery's is not
    Redis (bench/throughput.py --brokers amqp)."""
    parts = [benchmark, figures.get("mode") if "mode" in FIGURE_KEYS[benchmark] else None]
    return "-".join(str(p) for p in (*parts, figures.get("broker")) if p)


def load(directory: Path = CURRENT) -> list[dict[str, Any]]:
    """The records of the table's rows, in order, each checked."""
    found = {path.stem: path for path in directory.glob("*.json")}
    unknown = sorted(set(found) - set(ROWS))
    if unknown:
        raise FigureError(f"{directory}: not a row of the table: {', '.join(unknown)}")
    absent = [name for name in ROWS if name not in found]
    if absent:
        raise FigureError(f"{directory}: missing {', '.join(n + '.json' for n in absent)}")
    records = []
    for name in ROWS:
        record = json.loads(found[name].read_text())
        check(name, record)
        records.append(record)
    return records


def number(value: float) -> str:
    """As recorded, with thousands separated: 4830.9 -> 4,830.9, 5 -> 5."""
    return f"{value:,}" if isinstance(value, int) or value != int(value) else f"{int(value):,}"


def _throughput(f: dict[str, Any]) -> tuple[str, str]:
    median = spread = ""
    if f["runs"] > 1:
        median = f" (median of {f['runs']} runs" + (
            f", {number(f['spread_per_s'][0])}{DASH}{number(f['spread_per_s'][1])})"
            if "spread_per_s" in f
            else ")"
        )
    if "x_prefork_chain_spread" in f:  # recorded since issue 26: ratios round by round
        low, high = f["x_prefork_chain_spread"]
        spread = f" ({number(low)}{DASH}{number(high)}{TIMES} round by round)"
    on = ", Celery on RabbitMQ" if f.get("broker") == "amqp" else ""
    chain = " on RabbitMQ" if on else ""
    return (
        f"throughput, {f['mode']} mode{on}, {number(f['machines'])} machines",
        f"{number(f['transitions_per_s'])} transitions/s{median}; "
        f"{number(f['x_prefork_chain'])}{TIMES} the plain Celery chain{chain} on a prefork worker"
        f"{spread}{_against_redis(f)}",
    )


def _against_redis(f: dict[str, Any]) -> str:
    """A RabbitMQ row's comparison with Celery on Redis, measured in the same rounds."""
    if "x_redis" not in f:
        return ""
    low, high = f["x_redis_spread"]
    return (
        f"; {number(f['x_redis'])}{TIMES} Celery on Redis in the same rounds "
        f"({number(f['redis_transitions_per_s'])} transitions/s; {number(low)}{DASH}"
        f"{number(high)}{TIMES} round by round)"
    )


def _latency(f: dict[str, Any]) -> tuple[str, str]:
    tail = f", p99.9 {number(f['p999_ms'])} ms" if "p999_ms" in f else ""
    runs = ""
    if f.get("runs", 1) > 1:  # recorded since issue 26: medians of runs
        low, high = f["p99_spread_ms"]
        runs = f" (medians of {f['runs']} runs; p99 {number(low)}{DASH}{number(high)} ms)"
    return (
        f"latency, {f['mode']} mode, {number(f['machines'])} machines at "
        f"{f['load']:.0%} of the maximum (ack stored → next state_task stored)",
        f"p50 {number(f['p50_ms'])} ms, p99 {number(f['p99_ms'])} ms{tail}{runs}",
    )


def _scale(f: dict[str, Any]) -> tuple[str, str]:
    modes = "; ".join(
        f"{mode} mode {number(m['percent_of_empty'])}%{_percent_spread(m)}"
        for mode, m in sorted(f["modes"].items(), key=lambda item: item[0] != "inline")
    )
    return (
        f"scale, {number(f['machines'])} machines beside {number(f['finished'])} finished ones and "
        f"{number(f['history'])} history rows",
        f"{modes} of the throughput on an empty database",
    )


def _history(f: dict[str, Any]) -> tuple[str, str]:
    modes = "; ".join(
        f"{mode} mode {number(m['percent_of_empty'])}%{_percent_spread(m)}"
        for mode, m in sorted(f["modes"].items(), key=lambda item: item[0] != "inline")
    )
    return (
        f"history, {number(f['history'])} rows over {number(f['months'])} monthly partitions",
        f"{modes} of the throughput on an empty database; a machine's history p99 "
        f"{number(f['history_p99_ms'])} ms, the lists' p99 {number(f['list_p99_ms'])} ms at most; "
        f"retention removed {number(f['retention_months_removed'])} months: the longest lock "
        f"that stops a write {number(f['retention_lock_held_ms'])} ms held, "
        f"{number(f['retention_lock_waited_ms'])} ms waited for; the writer's longest statement "
        f"{number(f['retention_longest_statement_ms'])} ms",
    )


def _percent_spread(m: dict[str, Any]) -> str:
    if "percent_spread" not in m:  # recorded since issue 26: medians of rounds
        return ""
    low, high = m["percent_spread"]
    return f" ({number(low)}{DASH}{number(high)}%)"


def _fanout(f: dict[str, Any]) -> tuple[str, str]:
    """The map's runs beside the chord's: how many times faster (or, below 1, slower)."""
    median = f" (medians of {f['runs']} runs)" if f["runs"] > 1 else ""
    times = "; ".join(
        f"{name} {number(f['seconds'][name])} s"
        + (f" ({number(f['x_chord'][name])}{TIMES} the chord's speed)" if name != "chord" else "")
        for name in ("inline", "celery", "chord")
    )
    kept = "; ".join(  # recorded since the runs added a second map (issue 25)
        f"{name}'s {process} {number(f['after_mib'][name][process])} → {number(mib)} MiB"
        for name, processes in f.get("again_mib", {}).items()
        for process, mib in processes.items()
    )
    memory = f"; memory after the first map → after a second: {kept}" if kept else ""
    return (
        f"fan-out, {number(f['children'])} one-state children of one map (bench_map.yaml) to "
        "the join, against a Celery chord of as many no-op tasks (Redis result backend)",
        f"{times}{median}{memory}",
    )


def _memory(f: dict[str, Any]) -> tuple[str, str]:
    return (
        f"memory, {number(f['machines'])} machines waiting",
        f"worker {number(f['worker_waiting_mib'])} MiB; {number(f['worker_after_soak_mib'])} MiB "
        f"after a {number(f['soak_s'])} s soak",
    )


def _dashboard(f: dict[str, Any]) -> tuple[str, str]:
    stats = f"statistics p50 {number(f['stats_p50_ms'])} ms"
    if "stats_unfolded_p50_ms" in f:  # recorded since issue 26
        stats += (
            f", p99 {number(f['stats_p99_ms'])} ms (p50 {number(f['stats_unfolded_p50_ms'])} ms "
            "with nothing folded)"
        )
    return (
        f"dashboard, {number(f['finished'])} finished machines and {number(f['history'])} "
        "history rows",
        f"list p50 {number(f['list_p50_ms'])} ms, p99 {number(f['list_p99_ms'])} ms; a machine "
        f"p50 {number(f['machine_p50_ms'])} ms; {stats}; "
        f"{number(f['pages'])} live pages cost the engine {number(f['engine_loss_pct'])}% of "
        "its throughput",
    )


def _waiting(f: dict[str, Any]) -> tuple[str, str]:
    return (
        f"{number(f['waiting'])} machines waiting (agents, approvals, events; deadlines over a "
        "day)",
        f"the scan p99 {number(f['scan_p99_ms'])} ms ({number(f['scan_p99_ms_smallest'])} ms at "
        f"{number(f['smallest'])}); Redis {number(f['redis_bytes_per_waiting'])} B a machine; list "
        f"p99 {number(f['list_p99_ms'])} ms, statistics p99 {number(f['stats_p99_ms'])} ms, "
        f"approvals p99 {number(f['approvals_p99_ms'])} ms; starts "
        f"{number(round(f['starts_vs_empty'] * 100))}% of an empty database's; every process "
        f"restarted and serving in {number(f['restart_s'])} s; a worker "
        f"{number(f['worker_mib_smallest'])} MiB at {number(f['smallest'])} → "
        f"{number(f['worker_mib'])} MiB",
    )


FORMATS: dict[str, Callable[[dict[str, Any]], tuple[str, str]]] = {
    "throughput": _throughput,
    "latency": _latency,
    "scale": _scale,
    "history": _history,
    "memory": _memory,
    "fanout": _fanout,
    "dashboard": _dashboard,
    "waiting": _waiting,
}


def _run(record: dict[str, Any]) -> str:
    source = "measured" if record["source"] == "measured" else "transcribed"
    return f"{record['date']}, `{record['commit']}`, {record['machine']['cpus']} cores, {source}"


def verdicts(name: str, f: Figures) -> str:
    """The row's targets, each said to be met or not met, with the issue that set them."""
    targets = TARGETS.get(name, ())
    if not targets:
        return DASH
    issues = sorted({t.issue for t in targets})
    said = "; ".join(f"{t.says}: {'met' if t.met(f) else '**not met**'}" for t in targets)
    return f"{said} (issue {', '.join(str(i) for i in issues)})"


def figures_table(records: list[dict[str, Any]]) -> str:
    """The documents' table of the current figures, one row per record, each with the targets
    the issues set for it and whether its figures meet them."""
    lines = ["| measured | figures | target | run |", "| --- | --- | --- | --- |"]
    for record in records:
        f = record["figures"]
        what, figures = FORMATS[record["benchmark"]](f)
        target = verdicts(row_name(record["benchmark"], f), f)
        lines.append(f"| {what} | {figures} | {target} | {_run(record)} |")
    lines += [
        "",
        "Generated from `bench/results/current/*.json` by `make figures`. Each row is one run of "
        "its own (a ratio is always taken within one run); a transcribed row was measured "
        "before the benchmarks recorded their runs, and its file names the entry of "
        "docs/performance-history.md it comes from. The target column is what an issue asked "
        "of the row, met or not by the row's own figures; why one is not met, and what was "
        "tried, is in docs/performance-history.md.",
    ]
    return "\n".join(lines) + "\n"


def block(text: str, where: str) -> str:
    """What a document holds between its figures markers."""
    if BEGIN not in text or END not in text.partition(BEGIN)[2]:
        raise FigureError(f"{where}: no {BEGIN.strip()} … {END} markers")
    return text.split(BEGIN, 1)[1].split(END, 1)[0]


def write_table(document: Path, table: str) -> bool:
    """Put the table between the document's figures markers; whether it changed."""
    text = document.read_text()
    block(text, document.name)
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    updated = head + BEGIN + table + END + tail
    document.write_text(updated)
    return updated != text


def main() -> None:
    try:
        table = figures_table(load())
    except FigureError as error:
        raise SystemExit(f"bench.figures: {error}") from None
    for document in DOCUMENTS:
        changed = write_table(document, table)
        print(f"{document.relative_to(ROOT)}: {'updated' if changed else 'unchanged'}")


if __name__ == "__main__":  # make figures
    main()
