"""The Celery application."""

from __future__ import annotations

import os

from celery import Celery

app = Celery("fsm_celery", include=["fsm_celery.worker.tasks"])
app.config_from_object(os.environ.get("FSM_CELERY_CONFIG", "celeryconfig"))
