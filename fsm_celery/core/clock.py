"""Time as the engine keeps it: UTC, aware, durations in whole milliseconds."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fsm_celery.core.messages import INT64_MAX, INT64_MIN


def utcnow() -> datetime:
    return datetime.now(UTC)


def aware(value: datetime | None) -> datetime | None:
    """The datetime with UTC attached (SQLite hands back naive datetimes; all stored are UTC)."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def duration_ms(delta: timedelta) -> int:
    """A duration in whole milliseconds, within BIGINT (state_transitions.duration_ms)."""
    return max(INT64_MIN, min(INT64_MAX, int(delta.total_seconds() * 1000)))
