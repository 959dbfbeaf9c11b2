"""A worker publishes its buffered task events (Flower's) at most every EVENTS_LINGER seconds.

Celery buffers a worker's task events (task-received, task-started, task-succeeded, ...) and
publishes the buffer as one `task.multi` message, but it flushes as soon as its event loop comes
round (`Consumer.on_send_event_buffered` → `hub.call_soon`), which on a busy worker is after
nearly every event: 4.15 PUBLISH round trips per transition in the celery mode, each on the
consumer's own loop thread, the one that receives and acknowledges every task (16% of the
worker's samples under py-spy, issue 26). Here a flush that comes within EVENTS_LINGER of the
previous one is put off until EVENTS_LINGER has passed, on the loop's timer, so a busy worker
sends its events in one message every 20 ms, and an idle one at once. Flower reads a
`task.multi` message event by event as before; it sees a task at most 20 ms later.

The flush still runs on the loop's thread only (call_soon and the timer's callbacks both run
there), and the buffer's own bound (`event_dispatcher.buffer_limit`) still flushes a full buffer
at once, from whichever thread filled it.

On RabbitMQ the events' connection publishes without confirms (FSM_BROKER_URL's tasks keep
theirs). Celery registers that connection with the loop, which reads it (for heartbeats) while
a pool thread flushing a full buffer waits on it for its confirm: when the loop read the
confirm first, the thread waited forever holding the dispatcher's lock, and the loop, flushing
next, waited for the lock; the worker received nothing until RabbitMQ dropped the connection
minutes later (seen in tests/integration/test_rabbitmq.py). An event lost is a line Flower does
not show; a task is never sent on that connection.
"""

from __future__ import annotations

import time
from typing import Any

from celery.worker.consumer import consumer as celery_consumer

EVENTS_LINGER = 0.02
_MARK = "_fsm_lingers"


def apply() -> None:
    """Let each worker's consumer flush its task events at most every EVENTS_LINGER, on a
    connection without publisher confirms."""
    unconfirmed_events()
    flush: Any = celery_consumer.Consumer._flush_events
    if getattr(flush, _MARK, False):
        return

    def flush_lingering(consumer: Any) -> None:
        state = _state(consumer)
        wait = state["last"] + EVENTS_LINGER - time.monotonic()
        if wait > 0 and consumer.hub is not None:
            if not state["armed"]:  # one flush put off at a time: it takes all buffered
                state["armed"] = True
                consumer.hub.call_later(wait, flush_now, consumer)
            return
        flush_now(consumer)

    def flush_now(consumer: Any) -> None:
        state = _state(consumer)
        state["armed"], state["last"] = False, time.monotonic()
        flush(consumer)

    setattr(flush_lingering, _MARK, True)
    celery_consumer.Consumer._flush_events = flush_lingering


def _state(consumer: Any) -> dict[str, Any]:
    """When the consumer last flushed, and whether a flush is put off."""
    state: dict[str, Any] = consumer.__dict__.setdefault(_MARK, {"last": 0.0, "armed": False})
    return state


def unconfirmed_events() -> None:
    """The consumer's connection for writing (its events' only) without publisher confirms."""
    connect: Any = celery_consumer.Consumer.connection_for_write
    if getattr(connect, _MARK, False):
        return

    def unconfirmed(consumer: Any, url: str | None = None, heartbeat: float | None = None) -> Any:
        options = {"confirm_publish": False}
        conn = consumer.app.connection_for_write(
            url=url, heartbeat=heartbeat, transport_options=options
        )
        return consumer.ensure_connected(conn)

    setattr(unconfirmed, _MARK, True)
    celery_consumer.Consumer.connection_for_write = unconfirmed
