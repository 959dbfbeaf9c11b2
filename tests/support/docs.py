"""The code blocks of a page in docs/, as the tests that run them read them."""

from __future__ import annotations

import re
from pathlib import Path

from tests.support import ROOT

_BLOCK = re.compile(r"^```(\w+)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(page: str, language: str) -> list[str]:
    """The page's fenced blocks in that language, in order."""
    text = (ROOT / "docs" / page).read_text()
    return [body for lang, body in _BLOCK.findall(text) if lang == language]


def agent_example(folder: Path) -> Path:
    """docs/agents.md's complete agent, written where a test imports or runs it from."""
    [module] = [b for b in blocks("agents.md", "python") if b.startswith('"""research_agents.py')]
    path = folder / "research_agents.py"
    path.write_text(module)
    return path


def block_with(page: str, language: str, text: str) -> str:
    """The page's one block in that language that holds `text`."""
    [found] = [b for b in blocks(page, language) if text in b]
    return found
