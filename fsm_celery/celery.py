"""The Celery processes' edge: lets `celery -A fsm_celery worker` (beat, flower) find the app,
and gives the tasks their parts, built from FSM_* settings."""

from __future__ import annotations

import logging
from typing import Any

from celery.signals import (
    beat_init,
    celeryd_after_setup,
    celeryd_init,
    worker_process_init,
    worker_process_shutdown,
)
from pydantic import ValidationError

from fsm_celery import processes, traces, wiring
from fsm_celery.config import get_settings
from fsm_celery.exits import fail
from fsm_celery.worker.app import app

__all__ = ["app"]

try:
    _settings = get_settings()
except ValidationError as exc:  # a bad FSM_* setting: one line, not a traceback
    fail(exc)
traces.start("fsm-celery-worker")  # if OTEL_* asks for traces (docs/operations.md)
_worker = wiring.provide_worker(_settings)
if _settings.broker_is_amqp:  # the quorum queues' dead letters need a queue to go to
    from fsm_celery.worker.broker import DeadLetters

    app.steps["consumer"].add(DeadLetters)


@celeryd_init.connect
@beat_init.connect
def _refuse_a_guessable_secret(**_: Any) -> None:
    """A worker or beat signs task tokens: it does not start with a secret anyone could know."""
    problem = _settings.secret_problem()
    if problem is not None:
        from fsm_celery.exceptions import InsecureSecret

        fail(InsecureSecret(problem))


@celeryd_init.connect
def _record_the_worker(**_: Any) -> None:
    """Recorded in the deployment's state directory, for `fsm-celery stop`."""
    processes.record(_settings.state_directory, "worker")


@beat_init.connect
def _record_beat(**_: Any) -> None:
    processes.record(_settings.state_directory, "beat")


@worker_process_init.connect
def _forget_parent_connections(**_: Any) -> None:
    _worker.forget()


@celeryd_init.connect
def _serve_worker_metrics(conf: Any, options: dict[str, Any], **_: Any) -> None:
    """/metrics on FSM_METRICS_PORT (the pool's processes' values added up), set up before the
    pool forks."""
    from fsm_celery.metrics.celery import serve_worker

    serve_worker(_settings, str(options.get("pool_cls") or conf.worker_pool))


@worker_process_shutdown.connect
def _forget_pool_process(pid: int, **_: Any) -> None:
    from fsm_celery.metrics.instruments import forget_process

    forget_process(pid)


@beat_init.connect
def _serve_beat_metrics(**_: Any) -> None:
    from fsm_celery.metrics.celery import serve_beat

    serve_beat(_settings)


@celeryd_after_setup.connect
def _warn_of_a_slow_shape(sender: str, instance: Any, **_: Any) -> None:
    """A pool that cannot combine tasks' transactions (worker/shape.py) is said at start."""
    from fsm_celery.worker.shape import slow_shape

    pool = instance.pool_cls if isinstance(instance.pool_cls, str) else _path(instance.pool_cls)
    slow = slow_shape(pool, int(instance.concurrency or 1))
    if slow is not None:
        logging.getLogger("fsm_celery.worker").warning("worker %s: %s", sender, slow)


def _path(cls: Any) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


@celeryd_after_setup.connect
def _consume_housekeeping(sender: str, instance: Any, **_: Any) -> None:
    """Every `celery worker` runs the engine's periodic work (its own queue), whatever -Q
    names: `celery -A fsm_celery worker -Q fsm` needs no second worker for it."""
    queues = instance.app.amqp.queues
    queues.select_add(queues[_settings.housekeeping_queue])
