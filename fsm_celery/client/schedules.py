"""The client's schedules: the definitions' cron ticks, paused, resumed, triggered, and what
they did."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fsm_celery.client.base import ClientBase, dicts
from fsm_celery.engine.schedules import ScheduleInfo


class Schedules(ClientBase):
    """Read and command schedules."""

    def schedules(self) -> list[ScheduleInfo]:
        """Every schedule of the loaded definitions (retired ones too), with its latest run."""
        return self.engine.schedules.all()

    def schedule(self, ref: str) -> ScheduleInfo:
        """One schedule (TYPE/NAME, or TYPE when the type has one), with its latest run."""
        return self.engine.schedules.one(ref)

    def pause_schedule(self, ref: str, actor: str, reason: str = "") -> ScheduleInfo:
        """Start no machine on the schedule's ticks (TYPE/NAME, or TYPE) until it is resumed."""
        return self.engine.schedules.pause(ref, actor, reason)

    def resume_schedule(self, ref: str, actor: str, reason: str = "") -> ScheduleInfo:
        """Start machines on the schedule's ticks again, from the next one on."""
        return self.engine.schedules.resume(ref, actor, reason)

    def trigger_schedule(self, ref: str, actor: str, reason: str = "") -> UUID:
        """Start the schedule's machine now; returns its id."""
        first = self.engine.schedules.trigger(ref, actor, reason)
        self.enqueue(first)
        return first[0].machine_id

    def schedule_history(
        self, ref: str, limit: int = 20
    ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
        """The schedule's latest runs (tick, outcome, machine) and changes (who, what, why)."""
        runs, events = self.engine.schedules.history(ref, limit)
        return dicts(runs), dicts(events)
