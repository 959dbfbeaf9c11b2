"""The plain-Celery fan-out baseline: a chord of no-op tasks joined by Celery's Redis result
backend, whose callback records when it ran.

Same broker, same settings (celeryconfig) as fsm-celery's workers, plus the result backend a
chord needs, on a Redis database of its own (FSM_BENCH_RESULT_URL, database 14 unless told);
run as `celery -A bench.chord_app worker -Q <queue>`.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

import redis
from celery import Celery, signals

RESULT_URL = os.environ.get("FSM_BENCH_RESULT_URL", "redis://127.0.0.1:6379/14")

app = Celery("bench_chord")
app.config_from_object("celeryconfig")
# Celery's documentation says a chord's header tasks must not ignore their results, and its
# default stores them: celeryconfig's task_ignore_result (no backend in fsm-celery) is undone.
app.conf.update(result_backend=RESULT_URL, task_ignore_result=False)
_done = redis.Redis.from_url(os.environ["FSM_REDIS_URL"])


def ready_key(pid: int) -> str:
    """Where the worker whose main process is pid says it consumes (it logs nothing at the
    warning level it runs at, where logging every task would cost more than the task)."""
    return f"bench:chord:ready:{pid}"


@signals.worker_ready.connect
def _say_ready(**_: Any) -> None:
    _done.set(ready_key(os.getpid()), 1, ex=3600)


@app.task(name="bench.noop")
def noop() -> None:
    """One child of the chord's header: nothing to do."""


@app.task(name="bench.done")
def done(results: list[Any], key: str) -> None:
    """The chord's body: records when it ran and how many results the join handed it."""
    _done.set(key, json.dumps({"at": time.time(), "parts": len(results)}), ex=3600)
