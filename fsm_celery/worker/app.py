"""The Celery application."""

from __future__ import annotations

import os

from celery import Celery

from fsm_celery.worker import events, flower, kombu_patch

# Before any broker connection exists: without it a Redis restart can stop the worker.
kombu_patch.apply()
events.apply()  # task events in one message every 20 ms on a busy worker, not one per event
flower.guard()  # `celery -A fsm_celery flower` refuses to serve without authentication

app = Celery("fsm_celery", include=["fsm_celery.worker.tasks"])
app.config_from_object(os.environ.get("FSM_CELERY_CONFIG", "celeryconfig"))
