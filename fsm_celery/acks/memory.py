"""An in-memory consumer: the embedded demo's agents put their acks here, and tests drive the
bridge's loop through it as through Redis (a real stub, as dramatiq's StubBroker is: it counts
tries, hands failed messages out again, and keeps what it parks)."""

from __future__ import annotations

import threading
from collections import deque
from uuid import UUID

from fsm_celery.acks.consumer import Envelope
from fsm_celery.core.parking import reason
from fsm_celery.engine.ports import Inbound


class MemoryConsumer:
    name = "memory"
    redelivers = True

    def __init__(self, source: str = "memory", batch: int = 500) -> None:
        self.source, self.batch = source, batch
        self.finished: list[Envelope] = []
        self.parked: list[tuple[Envelope, str]] = []
        self._queue: deque[Envelope] = deque()
        self._ready = threading.Condition()

    def put(self, raw: str, agent: UUID | None = None) -> None:
        """An agent sends a message."""
        with self._ready:
            self._queue.append(Envelope(Inbound(raw, agent), self.source))
            self._ready.notify()

    def open(self) -> None:
        """Nothing to connect to."""

    def read(self, stop: threading.Event) -> list[Envelope]:
        with self._ready:
            if not self._queue:
                self._ready.wait(0.1)
            return [self._queue.popleft() for _ in range(min(self.batch, len(self._queue)))]

    def finish(self, envelopes: list[Envelope]) -> None:
        self.finished += envelopes

    def hand_on(self, envelopes: list[Envelope]) -> None:
        self.finish(envelopes)  # nothing a worker could settle: handed on is done with

    def retry(self, envelopes: list[Envelope]) -> None:
        with self._ready:
            self._queue.extendleft(d._replace(tries=d.tries + 1) for d in reversed(envelopes))
            self._ready.notify()

    def park(self, envelopes: list[Envelope], why: str | None = None) -> None:
        self.parked += [(d, why or reason(d)) for d in envelopes]

    def close(self) -> None:
        """Nothing read is held back: it was finished, retried or parked."""

    @property
    def idle(self) -> bool:
        """Whether nothing waits to be read."""
        with self._ready:
            return not self._queue
