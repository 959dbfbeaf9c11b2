"""Group commit for a worker's tasks: calls that arrive while one transaction runs wait, and the
next transaction takes them all.

A worker's threads each run a task: fsm.apply_acks with a few acks, fsm.enter_state with one
state. Run apart, they are as many transactions, and when they concern one machine (a fan-out's
children joining their parent) they queue on its row, each holding a thread and a commit's wait
while it holds the row. Through a Combiner, the first caller leads: it runs the work of every
call queued by then as one call, then hands each caller its own share of the result; calls
that arrive meanwhile are gathered for the next round. The busier the database, the larger the
rounds, so a slow commit is paid once per round, not per task. Each task still returns only
once its own work has committed (its message is acknowledged after that, as before), and a
failure of a round is every one of its callers' failure, as if each had run alone.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

T = TypeVar("T")

Run = Callable[[list[T]], list[T]]  # run the items at once; those it could not do


@dataclass(eq=False)
class _Call(Generic[T]):
    items: list[T]
    left: list[T] = field(default_factory=list)
    error: Exception | None = None
    done: bool = False


class Combiner(Generic[T]):
    """Runs `run` on the items of the calls queued, at most `most` items a round (a call larger
    than that alone); each call returns those of its items that `run` returned (could not do),
    or raises what `run` raised."""

    def __init__(self, run: Run[T], most: int) -> None:
        self._run, self._most = run, most
        self._ready = threading.Condition()
        self._queue: deque[_Call[T]] = deque()
        self._busy = False
        self.rounds = 0  # rounds run (for tests and logs)

    def __call__(self, items: list[T]) -> list[T]:
        call = _Call(items)
        with self._ready:
            self._queue.append(call)
        while True:
            with self._ready:
                while self._busy and not call.done:
                    self._ready.wait()
                if call.done:
                    if call.error is not None:
                        raise call.error
                    return call.left
                self._busy = True
                taken = self._take()
            try:
                self._round(taken)
            finally:
                with self._ready:
                    if any(not c.done for c in taken):  # interrupted: this thread is leaving,
                        # its own call with it; the others it took run in the next round
                        others = [c for c in taken if not c.done and c is not call]
                        self._queue.extendleft(reversed(others))
                        if call in self._queue:
                            self._queue.remove(call)
                    self._busy = False
                    self._ready.notify_all()

    def _take(self) -> list[_Call[T]]:
        """The calls of the next round, oldest first: at least one, at most `most` items."""
        taken = [self._queue.popleft()]
        size = len(taken[0].items)
        while self._queue and size + len(self._queue[0].items) <= self._most:
            size += len(self._queue[0].items)
            taken.append(self._queue.popleft())
        return taken

    def _round(self, calls: list[_Call[T]]) -> None:
        items = [item for call in calls for item in call.items]
        try:
            left = self._run(items)
        except Exception as exc:  # every caller's failure (a transient one: each retries)
            for call in calls:
                call.error, call.done = exc, True
            return
        finally:
            self.rounds += 1
        undone = {id(item) for item in left}
        for call in calls:
            call.left = [item for item in call.items if id(item) in undone]
            call.done = True
