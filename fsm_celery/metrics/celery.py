"""The Celery processes' metrics: a worker's and beat's /metrics (started from fsm_celery.celery's
signals), the scan's duration and last run, the history retention's runs, beat's sends.

A prefork worker's pool shares them through prometheus-client's multiprocess mode, set up in
the pool's parent before it forks (celeryd_init); a threads (or solo) pool has one process and
serves its own registry.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any, ParamSpec, TypeVar

from fsm_celery.config import Settings
from fsm_celery.metrics.instruments import enabled, instruments, serve, use_multiprocess

P = ParamSpec("P")
R = TypeVar("R")
SINGLE_PROCESS_POOLS = ("threads", "solo", "eventlet", "gevent")


def serve_worker(settings: Settings, pool: str) -> None:
    """/metrics of the worker (FSM_METRICS_PORT; none when 0), every pool process's values
    added up when the pool is of processes."""
    if not settings.metrics_port:
        return
    if not any(name in pool.lower() for name in SINGLE_PROCESS_POOLS):
        use_multiprocess()
    serve(settings.metrics_port, settings.metrics_address, "worker")


def serve_beat(settings: Settings) -> None:
    """/metrics of beat (FSM_METRICS_PORT), counting the periodic tasks it sends."""
    if not settings.metrics_port:
        return
    from celery.signals import before_task_publish

    serve(settings.metrics_port, settings.metrics_address, "beat")
    sends = instruments()["fsm_beat_sends_total"]
    for name in ("fsm.scan", "fsm.run_schedules"):  # seen at 0 before the first tick
        sends.labels(name)

    def count_send(sender: str | None = None, **_: Any) -> None:
        sends.labels(str(sender)).inc()

    before_task_publish.connect(count_send, weak=False)


def timed_scan(run: Callable[P, R]) -> Callable[P, R]:
    """The fsm.scan task, its duration observed and its end's time set (when this process
    counts)."""

    @functools.wraps(run)
    def timed(*args: P.args, **kwargs: P.kwargs) -> R:
        if not enabled():
            return run(*args, **kwargs)
        started = time.perf_counter()
        done = run(*args, **kwargs)
        m = instruments()
        m["fsm_scan_duration_seconds"].observe(time.perf_counter() - started)
        m["fsm_scan_last_run_timestamp_seconds"].set(time.time())
        return done

    return timed


def counted_retention(run: Callable[P, R]) -> Callable[P, R]:
    """The fsm.history task, each run counted: ran, or failed (it raised; a month whose action
    failed is in the worker's log)."""

    @functools.wraps(run)
    def counted(*args: P.args, **kwargs: P.kwargs) -> R:
        if not enabled():
            return run(*args, **kwargs)
        runs = instruments()["fsm_retention_runs_total"]
        try:
            done = run(*args, **kwargs)
        except Exception:
            runs.labels("failed").inc()
            raise
        runs.labels("ran").inc()
        return done

    return counted
