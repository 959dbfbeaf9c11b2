"""The Celery application."""

from __future__ import annotations

import os

from celery import Celery

from fsm_celery.worker import flower, kombu_patch

# Before any broker connection exists: without it a Redis restart can stop the worker.
kombu_patch.apply()
flower.guard()  # `celery -A fsm_celery flower` refuses to serve without authentication

app = Celery("fsm_celery", include=["fsm_celery.worker.tasks", "fsm_celery.acks.relay"])
app.config_from_object(os.environ.get("FSM_CELERY_CONFIG", "celeryconfig"))
