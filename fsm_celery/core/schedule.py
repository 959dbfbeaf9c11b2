"""Schedules: a definition's machines started by beat on a cron expression (pure: no I/O).

A schedule's ticks are the instants its cron expression names, in its timezone. The store keeps
the next tick due; when beat finds it past, the machine is started for the *latest* tick not
after now, and the next tick becomes the first after now: ticks missed while beat was down run
once on its return, not once each.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import croniter
from pydantic import BaseModel, ConfigDict, Field, field_validator

NAME_PATTERN = r"^[A-Za-z][A-Za-z0-9_-]*$"
MAX_CONTEXT_BYTES = 65_536  # a schedule's context is a few settings, not a payload


class Overlap(StrEnum):
    SKIP = "skip"  # no new machine while the schedule's previous one still runs
    ALLOW = "allow"


class Schedule(BaseModel):
    """When to start a machine of the definition, and with which context.

    cron: five fields (minute hour day month weekday), or six with seconds last
    (`*/15 * * * *`, `0 6 * * mon-fri`, `* * * * * */10`), read in timezone.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(default="default", max_length=50, pattern=NAME_PATTERN)
    cron: str = Field(max_length=100)
    timezone: str = Field(default="UTC", max_length=64)
    context: dict[str, Any] = Field(default_factory=dict)
    overlap: Overlap = Overlap.SKIP

    @field_validator("cron")
    @classmethod
    def _cron(cls, value: str) -> str:
        fields = value.split()
        if len(fields) not in (5, 6) or not croniter.is_valid(value):
            raise ValueError(
                f"not a cron expression: {value!r} (five fields: minute hour day month weekday; "
                "a sixth, last, for seconds)"
            )
        return " ".join(fields)

    @field_validator("timezone")
    @classmethod
    def _timezone(cls, value: str) -> str:
        zone(value)
        return value

    @field_validator("context")
    @classmethod
    def _context(cls, value: dict[str, Any]) -> dict[str, Any]:
        size = len(json.dumps(value, separators=(",", ":")).encode())
        if size > MAX_CONTEXT_BYTES:
            raise ValueError(f"context of {size} bytes: at most {MAX_CONTEXT_BYTES}")
        return value


def zone(name: str) -> ZoneInfo:
    """The IANA timezone called name (ValueError naming it when there is none)."""
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise ValueError(f"unknown timezone {name!r} (an IANA name: UTC, Europe/Paris)") from exc


def next_tick(cron: str, timezone: str, after: datetime) -> datetime:
    """The first tick strictly after `after` (an aware datetime), in UTC."""
    local = after.astimezone(zone(timezone))
    found: datetime = croniter(cron, local).get_next(datetime)
    return found.astimezone(UTC)


def latest_tick(cron: str, timezone: str, now: datetime) -> datetime:
    """The last tick at or before now, in UTC."""
    # ticks fall on whole seconds, and get_prev answers strictly before its start
    start = now.replace(microsecond=0) + timedelta(seconds=1)
    found: datetime = croniter(cron, start.astimezone(zone(timezone))).get_prev(datetime)
    return found.astimezone(UTC)


def due(
    cron: str, timezone: str, next_run_at: datetime, now: datetime
) -> tuple[datetime, datetime]:
    """For a schedule whose next tick is past: the tick to run (the latest not after now, so
    missed ticks collapse into one) and the next tick after now."""
    if next_run_at.tzinfo is None:  # SQLite hands back naive datetimes, stored in UTC
        next_run_at = next_run_at.replace(tzinfo=UTC)
    tick = max(next_run_at, latest_tick(cron, timezone, now))
    return tick, next_tick(cron, timezone, now)
