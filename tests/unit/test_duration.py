"""Durations as the docs write them: units, seconds, ISO 8601; anything else named as wrong."""

from __future__ import annotations

from datetime import timedelta

import pytest

from fsm_celery.core.duration import parse_duration
from fsm_celery.core.loader import load_text
from fsm_celery.exceptions import DefinitionError

DEFINITION = """\
type: t
agent_type: a
initial_state: WORK
states:
  - name: WORK
    timeout: {timeout}
    backoff: {{delay: 10s, max_delay: 10m}}
    on_success: DONE
    on_failure: DONE
  - name: DONE
    terminal: completed
"""


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("30s", 30),
        ("10m", 600),
        ("1h", 3600),
        ("4h", 4 * 3600),
        ("2d", 2 * 86_400),
        ("1h30m", 5400),
        ("1d 2h 3m 4s", 93_784),
        ("1.5h", 5400),
        ("90", 90),
        (90, 90),
        (2.5, 2.5),
        ("PT5M", 300),
        ("P1D", 86_400),
    ],
)
def test_a_duration_reads_units_seconds_and_iso_8601(text: str | float, seconds: float) -> None:
    assert parse_duration(text) == timedelta(seconds=seconds)


@pytest.mark.parametrize("text", ["5 minutes", "30m1h", "1w", "h", "", "1e999d", "9" * 60])
def test_a_duration_that_is_none_of_them_is_refused_naming_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match=r"units s, m, h, d .*ISO 8601"):
        parse_duration(text)


@pytest.mark.parametrize(("text", "seconds"), [("1h", 3600), ("10m", 600), ("1h30m", 5400)])
def test_a_state_timeout_takes_the_units_the_docs_use(text: str, seconds: int) -> None:
    state = load_text(DEFINITION.format(timeout=text)).state("WORK")
    assert state.timeout == timedelta(seconds=seconds)
    assert state.backoff.delay == timedelta(seconds=10)
    assert state.backoff.max_delay == timedelta(minutes=10)


def test_a_state_timeout_in_no_known_form_is_named_with_the_forms() -> None:
    with pytest.raises(DefinitionError) as caught:
        load_text(DEFINITION.format(timeout="an hour"))
    [problem] = caught.value.problems
    assert (problem.state, problem.field) == ("WORK", "timeout")
    assert "1h30m" in problem.message and "'an hour'" in problem.message
