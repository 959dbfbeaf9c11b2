"""Schedule ticks: cron expressions in a timezone, missed ticks collapsed (no I/O)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from fsm_celery.core.loader import load_file, load_text
from fsm_celery.core.schedule import Overlap, Schedule, due, latest_tick, next_tick
from fsm_celery.exceptions import DefinitionError
from tests.unit.conftest import SHIPPED_DEFINITIONS


def utc(*args: int) -> datetime:
    return datetime(*args, tzinfo=UTC)


def test_ticks_of_a_five_field_expression() -> None:
    assert next_tick("*/15 * * * *", "UTC", utc(2026, 1, 1, 12, 0)) == utc(2026, 1, 1, 12, 15)
    assert latest_tick("*/15 * * * *", "UTC", utc(2026, 1, 1, 12, 0)) == utc(2026, 1, 1, 12, 0)
    assert latest_tick("*/15 * * * *", "UTC", utc(2026, 1, 1, 12, 14, 59)) == utc(2026, 1, 1, 12, 0)


def test_a_sixth_field_counts_seconds() -> None:
    now = datetime(2026, 1, 1, 12, 0, 3, 500_000, tzinfo=UTC)
    assert latest_tick("* * * * * *", "UTC", now) == utc(2026, 1, 1, 12, 0, 3)
    assert next_tick("* * * * * */10", "UTC", now) == utc(2026, 1, 1, 12, 0, 10)


def test_a_timezone_moves_the_ticks_and_follows_daylight_saving() -> None:
    # 06:00 in Paris is 05:00 UTC in winter, 04:00 UTC in summer
    assert next_tick("0 6 * * *", "Europe/Paris", utc(2026, 1, 10)) == utc(2026, 1, 10, 5)
    assert next_tick("0 6 * * *", "Europe/Paris", utc(2026, 7, 10)) == utc(2026, 7, 10, 4)


def test_missed_ticks_collapse_into_the_latest() -> None:
    tick, following = due("*/15 * * * *", "UTC", utc(2026, 1, 1, 9, 0), utc(2026, 1, 1, 12, 7))
    assert (tick, following) == (utc(2026, 1, 1, 12, 0), utc(2026, 1, 1, 12, 15))
    naive = datetime(2026, 1, 1, 12, 0)  # as SQLite hands it back
    assert due("*/15 * * * *", "UTC", naive, utc(2026, 1, 1, 12, 0, 1))[0] == utc(2026, 1, 1, 12, 0)


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cron": "every day"}, "not a cron expression"),
        ({"cron": "61 * * * *"}, "not a cron expression"),
        ({"cron": "* * * * * * *"}, "not a cron expression"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "unknown timezone 'Mars/Olympus'"),
        ({"cron": "* * * * *", "overlap": "queue"}, "'skip' or 'allow'"),
        ({"cron": "* * * * *", "context": {"x": "y" * 70_000}}, "at most 65536"),
        ({"cron": "* * * * *", "name": "bad name"}, "should match pattern"),
    ],
)
def test_a_bad_schedule_is_refused_naming_what_is_wrong(
    fields: dict[str, object], message: str
) -> None:
    with pytest.raises(ValidationError, match=message):
        Schedule.model_validate(fields)


def test_a_definition_refuses_two_schedules_of_one_name() -> None:
    text = (SHIPPED_DEFINITIONS / "cto_infrastructure_check.yaml").read_text()
    twice = text.replace(
        "schedules:\n",
        "schedules:\n  - name: every-15-minutes\n    cron: '0 * * * *'\n",
    )
    with pytest.raises(DefinitionError, match="duplicate schedule name 'every-15-minutes'"):
        load_text(twice)


def test_the_infrastructure_check_ships_with_a_round_every_15_minutes() -> None:
    [schedule] = load_file(SHIPPED_DEFINITIONS / "cto_infrastructure_check.yaml").schedules
    assert (schedule.cron, schedule.timezone, schedule.overlap) == (
        "*/15 * * * *",
        "UTC",
        Overlap.SKIP,
    )
