"""The plain-Celery baseline: a no-op task that enqueues the next step of its chain.

Same broker, same settings (celeryconfig) as fsm-celery's workers; run as
`celery -A bench.chain_app worker -Q <queue>`.
"""

from __future__ import annotations

import os

import redis
from celery import Celery

from fsm_celery.worker.events import unconfirmed_events

# On RabbitMQ (confirm_publish) a thread worker's task events would hang it without this
# (fsm_celery/worker/events.py); on Redis it changes nothing.
unconfirmed_events()
app = Celery("bench_chain")
app.config_from_object("celeryconfig")
_done = redis.Redis.from_url(os.environ["FSM_REDIS_URL"])


@app.task(name="bench.step")
def step(chain: int, remaining: int, counter: str) -> None:
    """One step; the last one counts its chain as done."""
    if remaining > 1:
        step.delay(chain, remaining - 1, counter)
    else:
        _done.incr(counter)
