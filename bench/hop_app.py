"""A no-op task that records how long it waited since its publication (for bench.celery_hop).

Same broker and settings (celeryconfig) as fsm-celery's workers.
"""

from __future__ import annotations

import os
import time

import redis
from celery import Celery

app = Celery("bench_hop")
app.config_from_object("celeryconfig")
_latencies = redis.Redis.from_url(os.environ["FSM_REDIS_URL"])


@app.task(name="bench.hop")
def hop(sent: float) -> None:
    """Record the milliseconds since the publication."""
    _latencies.rpush("bench:hop:ms", f"{(time.time() - sent) * 1000:.3f}")
