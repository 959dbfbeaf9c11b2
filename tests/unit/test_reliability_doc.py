"""docs/reliability.md says what the soak (bench/soak.py) does: its load, faults, checks and
figures are the code's."""

from __future__ import annotations

from pathlib import Path

from bench import soak, soak_actors, soak_faults, soak_memory
from bench.soak_actors import Journal
from bench.soak_checks import Records, run_checks
from fsm_celery.core.loader import load_file

ROOT = Path(__file__).resolve().parents[2]
PAGE = (ROOT / "docs" / "reliability.md").read_text()
PROSE = " ".join(PAGE.split())  # its sentences, whatever their line breaks


def _table(heading: str) -> list[list[str]]:
    """The rows of the first table after the heading, cells stripped (the header left out)."""
    section = PAGE.split(f"## {heading}\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows[2:]]


def test_the_fault_table_is_every_fault_the_soak_makes_as_the_code_describes_it() -> None:
    described = {
        kind: text.removesuffix(" (`--broker amqp`)") for kind, text in _table("The faults")
    }
    assert described == {**soak_faults.KINDS, **soak_faults.BROKER_KINDS}


def test_the_load_table_is_every_kind_the_soak_starts_and_each_definition_loads() -> None:
    kinds = {kind: definition for kind, definition, _ in _table("The load")}
    assert kinds == soak_actors.KINDS
    for definition in kinds.values():
        assert load_file(ROOT / "bench" / "definitions" / f"{definition}.yaml").type == definition


def test_the_check_table_is_every_check_the_soak_runs_in_order() -> None:
    run = [check.name for check in run_checks(Records(), Journal())]
    listed = [name for name, _ in _table("The checks")]
    assert listed == [*run, soak.EXITS_CHECK, soak.MEMORY_CHECK]


def test_the_figures_the_page_quotes_are_the_codes() -> None:
    low, high = soak_faults.EVERY
    assert f"One every {low:g} to {high:g} seconds" in PROSE
    assert f"at most {soak_actors.IN_FLIGHT} root machines at a time" in PROSE
    assert f"reject (drawn gate by gate: {soak_actors.REJECTED:.0%} of them)" in PROSE
    assert f"within {soak_memory.GROWTH:.0%} (or {soak_memory.SLACK_MB:g} MiB" in PROSE
    assert soak_memory.MIN_SPAN_S == 600 and "series of ten minutes or more" in PROSE
    assert soak_memory.MIN_SHARE == 1 / 3 and "and a third of the run are judged" in PROSE
    args = soak.parse(["--mode", "inline"])
    assert (args.minutes, args.drain_minutes, tuple(args.every)) == (30, 5, (low, high))
    assert "given to end once the faults stop (5)" in PROSE
    assert f"the seconds between faults ({low:g} to {high:g})" in PROSE
    assert f"copied to `{soak.DEFAULT_SOAK_LOGS}/` (FSM_SOAK_LOGS)" in PROSE
