"""Every relative link in README.md and docs/*.md names a file that exists: a claim that cites
the test proving it must cite one that is there (README's reliability table, docs' pages)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_LINK = re.compile(r"\]\(([^)\s#]+)(?:#[^)]*)?\)")


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_every_relative_link_names_a_file_that_exists(page: Path) -> None:
    targets = [t for t in _LINK.findall(page.read_text()) if "://" not in t]
    missing = [t for t in targets if not (page.parent / t).exists()]
    assert missing == [], f"{page.name} links to files that do not exist: {missing}"


def test_readme_cites_a_test_for_each_reliability_claim() -> None:
    text = (ROOT / "README.md").read_text()
    table = text.split("What each reliability claim rests on", 1)[1].split("\n\n", 2)[1]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line]
    assert len(rows) > 5
    for row in rows[1:]:
        assert "](tests/" in row or "](docs/" in row, f"a claim without its proof: {row}"
