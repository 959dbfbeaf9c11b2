"""README.md and docs/performance.md quote one table of figures, the one bench/results/current/
gives (`make figures`), and README quotes no figure outside it; README names only real states."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from bench import figures
from fsm_celery.core.loader import definition_files, load_all

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
SHIPPED = ROOT / "definitions"
RECORDS = figures.load()
TABLE = figures.figures_table(RECORDS)

# A measured figure as the documents write one: a rate, a ratio, a share, a duration or a size.
FIGURE = re.compile(
    r"\d[\d,]*(?:\.\d+)?\s?(?:/s|"
    + figures.TIMES
    + r"|x\b|%|ms\b|µs|MiB|MB|GiB|steps/s|transitions/s|tx/s)"
)
NUMBER = re.compile(r"(?<![\w.])-?\d[\d,]*(?:\.\d+)?")  # a sign kept: a loss can be a gain


@pytest.mark.parametrize("document", figures.DOCUMENTS, ids=lambda d: d.name)
def test_the_documents_table_is_the_one_the_recorded_runs_give(document: Path) -> None:
    block = figures.block(document.read_text(), document.name)
    assert block == TABLE, (
        f"{document.name}'s figures differ from bench/results/current/: run `make figures`"
    )


def test_readme_quotes_no_figure_outside_the_table() -> None:
    head, _, rest = README.partition(figures.BEGIN)
    _, _, tail = rest.partition(figures.END)
    quoted = FIGURE.findall(head + tail)
    assert not quoted, f"README quotes figures outside the generated table: {quoted}"
    assert FIGURE.findall(TABLE), "the pattern no longer matches the table's own figures"


def _values(value: Any) -> list[float]:
    if isinstance(value, dict):
        return [v for item in value.values() for v in _values(item)]
    if isinstance(value, list):
        return [v for item in value for v in _values(item)]
    if isinstance(value, int | float) and not isinstance(value, bool):
        return [value]
    return []


def test_every_number_of_the_table_is_a_recorded_one() -> None:
    """The formatting invents no figure: each number the rows show is a value of a file (a
    share as its percentage), so changing a file is the only way to change the table."""
    for record in RECORDS:
        values = _values(record["figures"])
        recorded = {figures.number(v) for v in values} | {f"{v:.0%}"[:-1] for v in values}
        what, shown = figures.FORMATS[record["benchmark"]](record["figures"])
        strays = [n for n in NUMBER.findall(f"{what} | {shown}") if n not in recorded]
        assert not strays, f"{record['benchmark']}: {strays} are not in its file"


def test_a_changed_run_changes_the_table() -> None:
    changed = copy.deepcopy(RECORDS)
    changed[0]["figures"]["transitions_per_s"] = 1234.5
    assert "1,234.5 transitions/s" in figures.figures_table(changed)
    assert figures.figures_table(changed) != TABLE


def test_every_row_says_which_run_it_is() -> None:
    for record in RECORDS:
        assert re.fullmatch(r"\d{4}-\d\d-\d\d", record["date"]), record["date"]
        assert re.fullmatch(r"[0-9a-f]{7,40}(-dirty)?", record["commit"]), record["commit"]
        assert record["source"] == "measured" or "performance-history.md" in record["source"]
        assert record["conditions"], "a run says what else ran on the machine"


@pytest.mark.parametrize(
    ("name", "change", "message"),
    [
        ("throughput-inline", {"schema": 2}, "schema 2, expected 1"),
        ("throughput-inline", {"commit": None, "date": None}, None),
        ("throughput-celery", {}, "throughput-celery.json holds the throughput-inline figures"),
        ("latency-inline", {"benchmark": "speed"}, "unknown benchmark 'speed'"),
    ],
)
def test_a_record_that_cannot_be_a_row_is_refused_by_name(
    name: str, change: dict[str, Any], message: str | None
) -> None:
    record = {**copy.deepcopy(RECORDS[0]), **change}
    record = {k: v for k, v in record.items() if v is not None}
    with pytest.raises(figures.FigureError, match=re.escape(message or "missing date, commit")):
        figures.check(name, record)


def test_a_record_without_a_figure_its_row_shows_is_refused() -> None:
    record = copy.deepcopy(RECORDS[0])
    del record["figures"]["x_prefork_chain"]
    with pytest.raises(figures.FigureError, match="throughput figures lack x_prefork_chain"):
        figures.check("throughput-inline", record)


def test_the_flower_example_names_a_state_of_its_definition() -> None:
    match = re.search(r"`(\w+) <machine\s+id> state=(\w+) attempt=\d+`", README)
    assert match is not None, "README's Flower example is gone or reworded"
    definitions = {d.type: d for d in load_all(definition_files(SHIPPED))}
    machine_type, state = match.groups()
    assert state in {s.name for s in definitions[machine_type].states}


def test_every_target_names_a_row_of_the_table() -> None:
    assert set(figures.TARGETS) <= set(figures.ROWS)


def test_the_table_says_whether_each_target_is_met_from_the_same_file() -> None:
    latency = copy.deepcopy(next(r for r in RECORDS if r["benchmark"] == "latency"))
    latency["figures"].update(mode="inline", p50_ms=7.0, p99_ms=26.0)
    row = next(line for line in figures.figures_table([latency]).splitlines() if "p50 7 ms" in line)
    assert "p50 ≤ 8 ms: met; p99 ≤ 25 ms: **not met** (issue 42)" in row
    latency["figures"]["p99_ms"] = 25.0
    assert "p99 ≤ 25 ms: met (issue 42)" in figures.figures_table([latency])


def test_a_row_without_a_target_says_so() -> None:
    memory = next(r for r in RECORDS if r["benchmark"] == "memory")
    assert figures.verdicts("memory", memory["figures"]) == figures.DASH
