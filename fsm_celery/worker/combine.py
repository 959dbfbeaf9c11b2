"""Group commit for a worker's tasks: calls that arrive while one transaction runs wait, and the
next transaction takes them all.

A worker's threads each run a task: fsm.apply_acks with a few acks, fsm.enter_state with one
state. Run apart, they are as many transactions, and when they concern one machine (a fan-out's
children joining their parent) they queue on its row, each holding a thread and a commit's wait
while it holds the row. Through a Combiner, the first caller leads: it runs the work of every
call queued by then as one call, then hands each caller its own share of the result; calls
that arrive meanwhile are gathered for the next round. Up to `lanes` rounds run at once: a call
that arrives alone while fewer are running leads one at once instead of waiting for a whole
round (its latency); calls that queue together (a busy process) wait until no round runs, and
the next takes them all. The busier the database, the larger the rounds, so a slow commit is
paid once per round, not per task. Each task still returns only once its own work has
committed (its message is acknowledged after that, as before), and a failure of a round is
every one of its callers' failure, as if each had run alone.
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
    taken: bool = False  # in a round that runs now


class Combiner(Generic[T]):
    """Runs `run` on the items of the calls queued, at most `most` items a round (a call larger
    than that alone) and at most `lanes` rounds at once; each call returns those of its items
    that `run` returned (could not do), or raises what `run` raised."""

    def __init__(self, run: Run[T], most: int, lanes: int = 1) -> None:
        if lanes < 1:
            raise ValueError(f"lanes: at least 1, got {lanes}")
        self._run, self._most, self._lanes = run, most, lanes
        self._ready = threading.Condition()
        self._queue: deque[_Call[T]] = deque()
        self._running = 0  # rounds running now
        self.rounds = 0  # rounds run (for tests and logs)

    def __call__(self, items: list[T]) -> list[T]:
        call = _Call(items)
        with self._ready:
            self._queue.append(call)
        while True:
            with self._ready:
                while not call.done and (call.taken or not self._may_lead()):
                    self._ready.wait()
                if call.done:
                    if call.error is not None:
                        raise call.error
                    return call.left
                self._running += 1
                taken = self._take()
            try:
                self._round(taken)
            finally:
                with self._ready:
                    if any(not c.done for c in taken):  # interrupted: this thread is leaving,
                        # its own call with it; the others it took run in the next round
                        others = [c for c in taken if not c.done and c is not call]
                        for other in others:
                            other.taken = False
                        self._queue.extendleft(reversed(others))
                        if call in self._queue:
                            self._queue.remove(call)
                    self._running -= 1
                    self._ready.notify_all()

    def _may_lead(self) -> bool:
        """Whether a queued call may lead a round now: with none running, or, with a lane free,
        if it is the only one queued (a busy process, whose calls queue, groups them instead)."""
        return self._running == 0 or (self._running < self._lanes and len(self._queue) == 1)

    def _take(self) -> list[_Call[T]]:
        """The calls of the next round, oldest first: at least one, at most `most` items."""
        taken = [self._queue.popleft()]
        size = len(taken[0].items)
        while self._queue and size + len(self._queue[0].items) <= self._most:
            size += len(self._queue[0].items)
            taken.append(self._queue.popleft())
        for call in taken:
            call.taken = True
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
