"""A process's own metrics: prometheus-client's instruments, made from the catalog on first
use, and the /metrics server on FSM_METRICS_PORT.

A process of several (a prefork worker's pool, the ack bridge's consumer processes) shares
them through prometheus-client's multiprocess mode: the first process calls `multiprocess`
before it forks or spawns the others (each then writes its values to files in
PROMETHEUS_MULTIPROC_DIR), and its server adds them all up. The instruments are made after
that, on first use, so that a module imported earlier makes none in the wrong mode.
"""

from __future__ import annotations

import atexit
import logging
import os
import shutil
import tempfile
import threading
from functools import cache
from typing import Any

import prometheus_client
from prometheus_client import CollectorRegistry, multiprocess, values

from fsm_celery.metrics.catalog import METRICS, Kind, Where

log = logging.getLogger(__name__)

ENV = "PROMETHEUS_MULTIPROC_DIR"
_lock = threading.Lock()
_served: dict[str, Any] = {}


def multiprocess_mode() -> bool:
    return bool(os.environ.get(ENV))


def use_multiprocess() -> str:
    """Have this process and those it starts from now on (fork or spawn) write their values
    to a fresh directory (PROMETHEUS_MULTIPROC_DIR), removed when this process exits; the
    directory. Called before any instrument is made (`instruments` is made on first use)."""
    given = os.environ.get(ENV)
    if given:
        return given
    directory = tempfile.mkdtemp(prefix="fsm-metrics-")
    os.environ[ENV] = directory
    values.ValueClass = values.MultiProcessValue()  # type: ignore[no-untyped-call]
    atexit.register(shutil.rmtree, directory, ignore_errors=True)
    return directory


def forget_process(pid: int) -> None:
    """A process of the pool ended: its live gauges no longer count."""
    if multiprocess_mode():
        multiprocess.mark_process_dead(pid)  # type: ignore[no-untyped-call]


@cache
def instruments() -> dict[str, Any]:
    """This process's instruments, by name (made once, in the mode set by then)."""
    made: dict[str, Any] = {}
    for metric in METRICS:
        if metric.where is not Where.PROCESS:
            continue
        name = metric.name.removesuffix("_total") if metric.kind is Kind.COUNTER else metric.name
        if metric.kind is Kind.COUNTER:
            made[metric.name] = prometheus_client.Counter(name, metric.help, metric.labels)
        elif metric.kind is Kind.GAUGE:
            made[metric.name] = prometheus_client.Gauge(
                name, metric.help, metric.labels, multiprocess_mode=metric.multiprocess_mode
            )
        else:
            made[metric.name] = prometheus_client.Histogram(
                name, metric.help, metric.labels, buckets=metric.buckets
            )
    return made


def enabled() -> bool:
    """Whether this process counts: it serves /metrics, or one of its family does (the pool's
    parent, the bridge's first process: multiprocess mode)."""
    return bool(_served) or multiprocess_mode()


def count(name: str, *labels: str, by: float = 1.0) -> None:
    """Add to a counter, when this process counts."""
    if enabled():
        counter = instruments()[name]
        (counter.labels(*labels) if labels else counter).inc(by)


def registry() -> CollectorRegistry:
    """What /metrics serves: this process's registry, or every process's values (multiprocess)."""
    if not multiprocess_mode():
        return prometheus_client.REGISTRY
    collected = CollectorRegistry()
    multiprocess.MultiProcessCollector(collected)  # type: ignore[no-untyped-call]
    return collected


def serve(port: int, address: str, role: str) -> bool:
    """Serve /metrics on the port (once a process; 0: not at all); whether it serves. A port
    another process holds is logged, and this process counts all the same."""
    if not port:
        return False
    with _lock:
        if role in _served or _served:
            return True
        instruments()  # made now: a scrape before the first transition sees every counter
        try:
            _served[role] = prometheus_client.start_http_server(port, address, registry())
        except OSError as exc:  # the port taken: counted all the same, served by nobody
            _served[role] = None
            log.error("%s cannot serve /metrics on %s:%d: %s", role, address, port, exc)
            return False
    log.info("%s serves Prometheus metrics on http://%s:%d/metrics", role, address, port)
    return True
