"""The ack bridge's loop: each consumer read on a thread of its own, each batch handled, and
each message finished, handed on, tried again or parked (acks/dead.py says which).

A batch in hand is never given up because the database or Redis went away: it is handled
again, with a growing delay, until that works (nothing is read again, and no try is counted).
A consumer that loses its connection is opened again after a growing delay. So nothing one
message, one outage or one consumer does stops the others.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import NamedTuple

import redis

from fsm_celery.acks.consumer import Consumer, Envelope
from fsm_celery.channel.transient import TRANSIENT
from fsm_celery.core.parking import Policy
from fsm_celery.metrics.instruments import count

log = logging.getLogger(__name__)


class Handled(NamedTuple):
    """What became of a batch: the messages neither applied nor recorded (to try again or
    park), and those handed on to workers, which settle them once applied (acks/settle.py);
    the others were applied or recorded here."""

    failed: list[Envelope]
    handed_on: list[Envelope]


Handle = Callable[[list[Envelope]], Handled]
"""What the bridge does with a batch (apply it here, or relay it to workers); it raises only
transient errors."""


def applied_here(apply: Callable[[list[Envelope]], list[Envelope]]) -> Handle:
    """A handler that applies each batch itself (the inline mode, the demo): it hands nothing
    on; `apply` returns the messages it could neither apply nor record."""
    return lambda batch: Handled(apply(batch), [])


class Reconnect:
    """A delay that doubles up to a cap, and starts again once things work."""

    def __init__(self, first: float = 0.1, cap: float = 5.0) -> None:
        self.first, self.cap, self.delay = first, cap, first

    def next(self) -> float:
        """The delay to wait now; the one after it is twice as long."""
        delay = self.delay
        self.delay = min(self.delay * 2, self.cap)
        return delay

    def reset(self) -> None:
        self.delay = self.first


class Bridge:
    """Reads every consumer into the handler until stopped."""

    def __init__(self, consumers: list[Consumer], handle: Handle, policy: Policy) -> None:
        self.consumers, self.handle, self.policy = consumers, handle, policy

    def run(self, stop: threading.Event) -> None:
        """Serve every consumer, each on its thread, until stop is set."""
        threads = [
            threading.Thread(target=self._keep_serving, args=(c, stop), name=c.name, daemon=True)
            for c in self.consumers
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def _keep_serving(self, consumer: Consumer, stop: threading.Event) -> None:
        reconnect = Reconnect()
        while not stop.is_set():
            try:
                self.serve(consumer, stop, reconnect)
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                delay = reconnect.next()
                log.warning("%s lost Redis (%s); reconnecting in %.1fs", consumer.name, exc, delay)
                count("fsm_redis_reconnects_total", "bridge")
                stop.wait(delay)
            except Exception:
                delay = reconnect.next()
                log.exception("%s failed; restarting it in %.1fs", consumer.name, delay)
                stop.wait(delay)

    def serve(self, consumer: Consumer, stop: threading.Event, reconnect: Reconnect) -> None:
        """Read, handle and finish batch after batch until stop is set."""
        consumer.open()
        try:
            while not stop.is_set():
                batch = consumer.read(stop)
                reconnect.reset()
                if batch:
                    self._handle(consumer, batch, stop)
        finally:
            try:
                consumer.close()
            except redis.RedisError as exc:  # what it had to acknowledge, it does on next read
                log.warning("%s could not close (%s)", consumer.name, exc)

    def _handle(self, consumer: Consumer, batch: list[Envelope], stop: threading.Event) -> None:
        crashed, todo = self.policy.crashed(batch)
        failed, handed_on = handle_until_done(self.handle, todo, stop) if todo else ([], [])
        kept = {id(d) for d in failed} | {id(d) for d in handed_on}
        consumer.finish([d for d in todo if id(d) not in kept])
        if handed_on:
            consumer.hand_on(handed_on)
        count("fsm_bridge_messages_total", "finished", by=len(todo) - len(failed))
        if crashed:
            consumer.park(crashed, Policy.CRASHED)
            count("fsm_bridge_messages_total", "parked", by=len(crashed))
        if failed:
            parked, again = self.policy.sort(failed, redelivers=consumer.redelivers)
            if parked:
                consumer.park(parked)
                count("fsm_bridge_messages_total", "parked", by=len(parked))
            if again:
                consumer.retry(again)
                count("fsm_bridge_messages_total", "retried", by=len(again))


def handle_until_done(handle: Handle, batch: list[Envelope], stop: threading.Event) -> Handled:
    """Handle the batch, trying again with a growing delay while the database or Redis is away
    (the batch stays in hand: nothing is read again, nothing counts as a failed try)."""
    delay = Reconnect()
    while True:
        try:
            return handle(batch)
        except TRANSIENT as exc:
            if stop.is_set():
                raise
            wait = delay.next()
            log.warning("could not apply a batch (%s); trying again in %.1fs", exc, wait)
            stop.wait(wait)
