"""Lets `celery -A fsm_celery worker` find the app."""

from __future__ import annotations

from fsm_celery.worker.app import app

__all__ = ["app"]
