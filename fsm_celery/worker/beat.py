"""Beat's scheduler: Celery's own, whose schedule file lives in FSM_STATE_DIR."""

from __future__ import annotations

from pathlib import Path

from celery.beat import PersistentScheduler


class Scheduler(PersistentScheduler):  # type: ignore[misc]  # celery.beat is untyped
    """Celery's persistent scheduler, which first makes its file's folder (a fresh host has
    no ~/.local/state/fsm-celery yet)."""

    def setup_schedule(self) -> None:
        Path(self.schedule_filename).parent.mkdir(parents=True, exist_ok=True)
        super().setup_schedule()
