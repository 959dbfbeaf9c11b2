"""The validator's refusals, as the definition tests read them: the problems a text is refused
with, the one problem it is refused with, and what a problem must say."""

from __future__ import annotations

import pytest

from fsm_celery.core.loader import load_text
from fsm_celery.exceptions import DefinitionError, Problem


def problems(text: str, *, source: str, one_line: bool = False) -> list[Problem]:
    """The problems the text is refused with (each on one line, if asked)."""
    with pytest.raises(DefinitionError) as caught:
        load_text(text, source)
    if one_line:
        for problem in caught.value.problems:
            assert "\n" not in str(problem), problem
    return caught.value.problems


def only_problem(text: str, *, source: str, one_line: bool = False) -> Problem:
    found = problems(text, source=source, one_line=one_line)
    assert len(found) == 1, found
    return found[0]


def assert_problem(
    p: Problem, state: str | None, field: str | None, fragment: str, *, source: str
) -> None:
    assert (p.source, p.state, p.field) == (source, state, field), p
    assert fragment in p.message, p
