"""docs/security.md points each claim at the test that proves it: every test file it names
exists, every test it names is defined in a file it names, and every setting it names is one."""

from __future__ import annotations

import re

from fsm_celery.config import Settings
from tests.support import ROOT

DOC = (ROOT / "docs" / "security.md").read_text()


def test_every_test_file_named_exists() -> None:
    files = set(re.findall(r"\*(tests/[\w/]+\.py)\*", DOC))
    assert len(files) >= 10
    assert [f for f in sorted(files) if not (ROOT / f).is_file()] == []


def test_every_test_named_is_defined_in_a_file_named() -> None:
    files = set(re.findall(r"\*(tests/[\w/]+\.py)\*", DOC))
    sources = "".join((ROOT / f).read_text() for f in files)
    names = set(re.findall(r"`(test_\w+)`", DOC))
    assert len(names) >= 8
    assert [n for n in sorted(names) if f"def {n}(" not in sources] == []


def test_every_setting_named_is_a_setting() -> None:
    named = {n.removeprefix("FSM_").lower() for n in re.findall(r"\bFSM_[A-Z_]+[A-Z]\b", DOC)}
    assert [n for n in sorted(named) if n not in Settings.model_fields] == []


def test_every_door_has_its_section() -> None:
    for door in (
        "Agents",
        "GitHub",
        "Signed events",
        "Approvers",
        "Viewers",
        "Admins",
        "MCP",
        "CLI",
    ):
        assert re.search(rf"^## .*{door}", DOC, re.M), door
