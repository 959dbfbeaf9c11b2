"""The errors of the surroundings: the database, Redis or the broker away, not a message or a
row at fault. What failed with one is tried again once it passes: the bridge keeps its batch,
the applier does not split it, a worker's task retries (fsm_celery.worker.tasks.RETRY)."""

from __future__ import annotations

import kombu.exceptions
import redis
import sqlalchemy.exc

REDIS_AWAY = (redis.ConnectionError, redis.TimeoutError)  # the dispatcher's, given to the engine

TRANSIENT = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    *REDIS_AWAY,
    kombu.exceptions.OperationalError,  # the broker, when a task could not be published
)
