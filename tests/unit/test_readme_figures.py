"""README quotes one set of measured figures, docs/performance.md's, and names only real states."""

from __future__ import annotations

import re
from pathlib import Path

from fsm_celery.core.loader import definition_files, load_all

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
PERFORMANCE = (ROOT / "docs" / "performance.md").read_text()
SHIPPED = ROOT / "definitions"

TIMES = "\N{MULTIPLICATION SIGN}"
# A figure: a rate, a ratio, a duration or a size, as the two documents write them.
FIGURE = re.compile(r"\d[\d,]*(?:\.\d+)?(?:/s|" + TIMES + r"| ms| MiB| steps/s| transitions/s)")


def _section(text: str, heading: str) -> str:
    return text.split(heading, 1)[1].split("\n#", 1)[0]


def test_every_figure_readme_quotes_is_one_docs_performance_records() -> None:
    quoted = FIGURE.findall(_section(README, "### Transition modes"))
    quoted += FIGURE.findall(_section(README, "## Performance"))
    assert quoted, "README quotes no figure: the pattern no longer matches its text"
    missing = [f for f in quoted if f.split()[0].rstrip(TIMES + "/s") not in PERFORMANCE]
    assert not missing, f"README quotes figures docs/performance.md does not record: {missing}"


def test_readme_quotes_the_transition_figures_of_the_latest_run() -> None:
    latest = PERFORMANCE.split("## The transition path after issue 14", 1)[-1]
    modes = _section(README, "### Transition modes")
    for figure in re.findall(r"\d[\d,]*\.\d+/s|\d+\.\d+" + TIMES, modes):
        assert figure.rstrip(TIMES + "/s") in latest, f"{figure} is not from the latest run"


def test_the_flower_example_names_a_state_of_its_definition() -> None:
    match = re.search(r"`(\w+) <machine\s+id> state=(\w+) attempt=\d+`", README)
    assert match is not None, "README's Flower example is gone or reworded"
    definitions = {d.type: d for d in load_all(definition_files(SHIPPED))}
    machine_type, state = match.groups()
    assert state in {s.name for s in definitions[machine_type].states}
