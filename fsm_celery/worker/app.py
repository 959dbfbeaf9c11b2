"""The Celery application."""

from __future__ import annotations

import os
from typing import Any

from celery import Celery
from celery.signals import celeryd_after_setup

from fsm_celery.worker import flower, kombu_patch

# Before any broker connection exists: without it a Redis restart can stop the worker.
kombu_patch.apply()
flower.guard()  # `celery -A fsm_celery flower` refuses to serve without authentication

app = Celery("fsm_celery", include=["fsm_celery.worker.tasks"])
app.config_from_object(os.environ.get("FSM_CELERY_CONFIG", "celeryconfig"))


def _consume_housekeeping(sender: str, instance: Any, **_: Any) -> None:
    """Every `celery worker` runs the engine's periodic work (its own queue), whatever -Q
    names: `celery -A fsm_celery worker -Q fsm` needs no second worker for it."""
    from fsm_celery.config import get_settings

    queues = instance.app.amqp.queues
    queues.select_add(queues[get_settings().housekeeping_queue])


celeryd_after_setup.connect(_consume_housekeeping, weak=False, dispatch_uid="fsm_celery.queues")
