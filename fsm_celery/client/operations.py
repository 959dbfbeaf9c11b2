"""The client's view for operators: statistics, rejected and parked messages, notifications
sent, and the history's monthly partitions and retention."""

from __future__ import annotations

from typing import Any
from uuid import UUID

from fsm_celery.client.base import ClientBase, dicts
from fsm_celery.engine.retention import Outcome
from fsm_celery.records import notification_view
from fsm_celery.store.partitions import Partition


class Operations(ClientBase):
    """What operators watch and run."""

    def stats(self) -> dict[str, Any]:
        """Machines by status, type and agent type; attempts per state (success rate, p50 and
        p95 durations); completion rate per type; usage per type and agent; rejections."""
        return self.engine.stats.read()

    def rejected(
        self, machine_id: UUID | str | None = None, limit: int = 100
    ) -> list[dict[str, Any]]:
        """The latest rejected messages, newest first."""
        return dicts(self.reader.rejections(machine_id, limit))

    def parked(self, limit: int = 100) -> list[dict[str, str]]:
        """Messages the bridge could neither apply nor record, newest first (dead letters)."""
        return self._parked(limit) if self._parked is not None else []

    def notifications(self, machine_id: UUID | str, *, admin: bool = False) -> list[dict[str, Any]]:
        """The machine's notifications: where, whether delivered, tries, the last error; the
        receivers' paths and answers only for an admin (records.notification_view)."""
        return [
            notification_view(n, admin=admin) for n in dicts(self.reader.notifications(machine_id))
        ]

    def history_months(self) -> dict[str, list[Partition]]:
        """The monthly partitions of the history and of the rejected messages, oldest first
        (PostgreSQL; none on SQLite)."""
        return self.engine.retention.months()

    def archive_history(
        self,
        retention_days: float | None = None,
        archive: str | None = None,
        dry_run: bool = False,
    ) -> list[Outcome]:
        """Run the history's retention now (FSM_HISTORY_RETENTION_DAYS, FSM_HISTORY_ARCHIVE,
        unless given): the months ahead made, those past it archived and removed, or, in a
        dry run, listed."""
        return self.engine.retention.run(retention_days, archive, dry_run)
