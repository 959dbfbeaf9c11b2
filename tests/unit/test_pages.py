"""How the dashboard's pages write durations and a state's retries (dashboard.js mirrors both)."""

from __future__ import annotations

import pytest

from fsm_celery.http.pages import duration, retries_text


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (None, "—"),
        (0, "0 ms"),
        (999, "999 ms"),
        (1000, "1.0 s"),
        (1250, "1.3 s"),
        (8449, "8.4 s"),
        (59_949, "59.9 s"),
        (59_950, "1 min"),
        (300_000, "5 min"),
        (362_375, "6 min 2 s"),
        (3_600_000, "1 h"),
        (11_100_000, "3 h 5 min"),
        (187_200_000, "2 d 4 h"),
        (2_592_000_000, "30 d"),
    ],
)
def test_a_duration_reads_in_the_unit_a_person_would_use(ms: int | None, shown: str) -> None:
    assert duration(ms) == shown


@pytest.mark.parametrize(
    ("used", "allowed", "shown"),
    [
        (0, None, "—"),
        (0, 0, "no retries"),
        (0, 3, "first try (up to 3 retries)"),
        (1, 3, "retry 1 of 3"),
        (3, 3, "retry 3 of 3"),
    ],
)
def test_a_states_retries_are_shown_against_what_it_allows(
    used: int, allowed: int | None, shown: str
) -> None:
    assert retries_text(used, allowed) == shown
