"""Group commit (fsm_celery.worker.combine): calls from many threads are run together, each
call gets back its own share of what was left undone, and a round's failure is each of its
callers' failure."""

from __future__ import annotations

import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from fsm_celery.worker.combine import Combiner


class Gate:
    """A run that blocks its first round until released, recording every round's items."""

    def __init__(self, leave: set[int] | None = None) -> None:
        self.rounds: list[list[int]] = []
        self.entered = threading.Event()
        self.release = threading.Event()
        self.leave = leave or set()

    def __call__(self, items: list[int]) -> list[int]:
        self.rounds.append(list(items))
        if len(self.rounds) == 1:
            self.entered.set()
            assert self.release.wait(5)
        return [item for item in items if item in self.leave]


def _calls_while_first_runs(gate: Gate, combiner: Combiner[int], calls: list[list[int]]) -> list:
    """Start the first call, queue the others while it runs, release it; every call's result."""
    with ThreadPoolExecutor(len(calls)) as pool:
        first = pool.submit(combiner, calls[0])
        assert gate.entered.wait(5)
        rest = []
        for queued, items in enumerate(calls[1:], start=1):  # queued in order behind the first
            rest.append(pool.submit(combiner, items))
            while len(combiner._queue) < queued:
                threading.Event().wait(0.001)
        gate.release.set()
        return [future.result(5) for future in [first, *rest]]


def test_calls_that_arrive_during_a_round_run_together_in_the_next() -> None:
    gate = Gate()
    combiner = Combiner(gate, most=100)
    calls = [[0]] + [[n, n + 100] for n in range(1, 9)]
    results = _calls_while_first_runs(gate, combiner, calls)
    assert results == [[] for _ in calls]
    assert len(gate.rounds) == 2  # the first alone, then the eight waiting together
    assert sorted(gate.rounds[1]) == sorted(i for items in calls[1:] for i in items)


def test_each_call_gets_back_only_its_own_items_left_undone() -> None:
    gate = Gate(leave={3, 104, 7})
    combiner = Combiner(gate, most=100)
    calls = [[0]] + [[n, n + 100] for n in range(1, 9)]
    results = _calls_while_first_runs(gate, combiner, calls)
    assert results[3] == [3] and results[4] == [104] and results[7] == [7]
    assert all(r == [] for i, r in enumerate(results) if i not in (3, 4, 7))


def test_a_round_takes_at_most_most_items_in_arrival_order() -> None:
    gate = Gate()
    combiner = Combiner(gate, most=4)
    calls = [[0], [1, 2], [3, 4], [5], [6, 7, 8, 9, 10]]
    _calls_while_first_runs(gate, combiner, calls)
    assert gate.rounds == [[0], [1, 2, 3, 4], [5], [6, 7, 8, 9, 10]]  # a large call alone


def test_a_failed_round_fails_every_call_in_it_and_the_next_round_runs() -> None:
    class Flaky(Gate):
        def __call__(self, items: list[int]) -> list[int]:
            super().__call__(items)
            if len(self.rounds) == 2:
                raise ConnectionError("the database went away")
            return []

    gate = Flaky()
    combiner = Combiner(gate, most=100)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(combiner, [0])
        assert gate.entered.wait(5)
        second = [pool.submit(combiner, [n]) for n in (1, 2)]
        while len(combiner._queue) < 2:
            threading.Event().wait(0.001)
        gate.release.set()
        assert first.result(5) == []
        for future in second:
            with pytest.raises(ConnectionError, match="went away"):
                future.result(5)
    assert combiner([3]) == []  # the combiner is free again
    assert gate.rounds[-1] == [3]


def test_many_threads_lose_and_double_nothing() -> None:
    seen: list[int] = []
    lock = threading.Lock()

    def run(items: list[int]) -> list[int]:
        with lock:
            seen.extend(items)
        threading.Event().wait(0.0005)
        return [i for i in items if i % 7 == 0]

    combiner = Combiner(run, most=50)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda n: combiner([n, n + 10_000]), range(500)))
    assert sorted(seen) == sorted([*range(500), *range(10_000, 10_500)])
    for n, left in enumerate(results):
        assert left == [i for i in (n, n + 10_000) if i % 7 == 0]
    assert combiner.rounds < 500


def test_a_round_interrupted_leaves_with_its_thread_and_the_others_run_next() -> None:
    class Stop(BaseException):
        """What stops a thread (a worker shutting down), not a failure of the work."""

    class Interrupted(Gate):
        def __call__(self, items: list[int]) -> list[int]:
            super().__call__(items)
            if len(self.rounds) == 2:
                raise Stop
            return []

    gate = Interrupted()
    combiner = Combiner(gate, most=1)  # one call a round
    with ThreadPoolExecutor(3) as pool:
        first = pool.submit(combiner, [0])
        assert gate.entered.wait(5)
        second = pool.submit(combiner, [1])
        while len(combiner._queue) < 1:
            threading.Event().wait(0.001)
        third = pool.submit(combiner, [2])
        while len(combiner._queue) < 2:
            threading.Event().wait(0.001)
        gate.release.set()
        assert first.result(5) == []
        leader = second if second.exception(5) is not None else third
        assert isinstance(leader.exception(5), Stop)
        assert (third if leader is second else second).result(5) == []
    # the second round took the oldest call, [1], and was interrupted; the call of the thread
    # that left is never run, the other's is, in the next round
    other = [2] if leader is second else [1]
    assert gate.rounds == [[0], [1], other]
    assert not combiner._queue


def test_with_a_lane_free_a_call_runs_at_once_beside_a_running_round() -> None:
    gate = Gate()
    combiner = Combiner(gate, most=100, lanes=2)
    with ThreadPoolExecutor(4) as pool:
        first = pool.submit(combiner, [0])
        assert gate.entered.wait(5)
        assert pool.submit(combiner, [1]).result(5) == []  # the first round still holds its lane
        assert not first.done()
        gate.release.set()
        assert first.result(5) == []
    assert gate.rounds == [[0], [1]]


def test_calls_that_queue_together_wait_for_the_running_rounds_and_run_as_one() -> None:
    """A lane is opened for a call that arrives alone; calls that queue together (a busy
    process) are grouped: they wait until no round runs, then run as one."""

    class Gates:
        """Rounds that each block until released, in the order they started."""

        def __init__(self) -> None:
            self.rounds: list[list[int]] = []
            self.started = threading.Semaphore(0)
            self.release: list[threading.Event] = []
            self.lock = threading.Lock()

        def __call__(self, items: list[int]) -> list[int]:
            with self.lock:
                self.rounds.append(list(items))
                released = threading.Event()
                self.release.append(released)
            self.started.release()
            assert released.wait(5)
            return []

    gates = Gates()
    combiner = Combiner(gates, most=100, lanes=2)
    with ThreadPoolExecutor(6) as pool:
        running = []
        for n in (0, 1):  # each arrives alone: each opens a lane
            running.append(pool.submit(combiner, [n]))
            assert gates.started.acquire(timeout=5)
        queued = [pool.submit(combiner, [n]) for n in (2, 3, 4)]
        while len(combiner._queue) < 3:
            threading.Event().wait(0.001)
        gates.release[0].set()  # a lane frees: the three, queued together, still wait
        assert running[0].result(5) == []
        assert not gates.started.acquire(timeout=0.2)
        gates.release[1].set()  # no round runs: the three run as one
        assert gates.started.acquire(timeout=5)
        gates.release[2].set()
        assert [f.result(5) for f in running + queued] == [[]] * 5
    assert gates.rounds == [[0], [1], [2, 3, 4]]


@pytest.mark.parametrize("lanes", [2, 4])
def test_many_threads_in_several_lanes_lose_and_double_nothing(lanes: int) -> None:
    seen: list[int] = []
    lock = threading.Lock()
    running, most_running = [0], [0]

    def run(items: list[int]) -> list[int]:
        with lock:
            seen.extend(items)
            running[0] += 1
            most_running[0] = max(most_running[0], running[0])
        threading.Event().wait(0.0005)
        with lock:
            running[0] -= 1
        return [i for i in items if i % 7 == 0]

    combiner = Combiner(run, most=50, lanes=lanes)
    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(lambda n: combiner([n, n + 10_000]), range(500)))
    assert sorted(seen) == sorted([*range(500), *range(10_000, 10_500)])
    for n, left in enumerate(results):
        assert left == [i for i in (n, n + 10_000) if i % 7 == 0]
    assert most_running[0] <= lanes


def test_lanes_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="lanes: at least 1, got 0"):
        Combiner(lambda items: [], most=1, lanes=0)
