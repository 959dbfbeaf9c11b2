"""An in-process message bus for the embedded demo: pub/sub without a server."""

from __future__ import annotations

import queue
import threading
from collections import defaultdict
from collections.abc import Callable, Sequence

from fsm_celery.core.messages import StateEvent, events_channel, task_channel

Listener = Callable[[str], None]


class MemoryBus:
    """Delivers each published message to every subscriber of its channel, on their threads."""

    def __init__(self, prefix: str = "") -> None:
        self._prefix = prefix
        self._lock = threading.Lock()
        self._inboxes: dict[str, list[queue.Queue[str | None]]] = defaultdict(list)
        self._threads: list[threading.Thread] = []

    def publish(self, channel: str, message: str) -> int:
        with self._lock:
            inboxes = list(self._inboxes.get(channel, ()))
        for inbox in inboxes:
            inbox.put(message)
        return len(inboxes)

    def dispatch_many(self, messages: list[tuple[str, str]]) -> None:
        for agent, message in messages:
            self.publish(task_channel(agent, self._prefix), message)

    def cancel_many(self, messages: list[tuple[str, str]]) -> None:
        """Nothing: the embedded demo's agents read no stream, and answer at once."""

    def announce(self, events: Sequence[StateEvent]) -> None:
        channel = events_channel(self._prefix)
        for event in events:
            self.publish(channel, event.to_wire())

    def subscribe(self, channel: str, listener: Listener) -> None:
        """Call listener with every message on channel, one at a time, on a thread of its own."""
        inbox: queue.Queue[str | None] = queue.Queue()
        thread = threading.Thread(target=_serve, args=(inbox, listener), daemon=True)
        with self._lock:
            self._inboxes[channel].append(inbox)
            self._threads.append(thread)
        thread.start()

    def close(self) -> None:
        with self._lock:
            inboxes = [i for group in self._inboxes.values() for i in group]
            self._inboxes.clear()
        for inbox in inboxes:
            inbox.put(None)
        for thread in self._threads:
            thread.join(5)


def _serve(inbox: queue.Queue[str | None], listener: Listener) -> None:
    while (message := inbox.get()) is not None:
        listener(message)
