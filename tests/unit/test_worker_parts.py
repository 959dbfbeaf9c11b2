"""A worker's parts: fsm.enter_state's steps entered together, and each alone when together
they failed for a reason that may be one step's."""

from __future__ import annotations

import threading
import uuid
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace
from typing import Any

import pytest
import sqlalchemy.exc

from fsm_celery.config import Settings
from fsm_celery.worker.parts import Worker


class _Entry:
    def __init__(self, error: Exception | None = None) -> None:
        self.error = error
        self.calls: list[list[Any]] = []

    def enter_many(self, steps: list[Any]) -> list[Any]:
        self.calls.append(steps)
        if self.error is not None and len(steps) > 1:
            raise self.error
        return []


def _worker(entry: _Entry, settings: Settings | None = None) -> Worker:
    engine: Any = SimpleNamespace(entry=entry)
    worker = Worker(settings or Settings(), lambda: engine, lambda: pytest.fail("no dead letters"))
    worker.enqueue = lambda next_states: None  # type: ignore[assignment]
    return worker


STEPS = [(uuid.uuid4(), 1), (uuid.uuid4(), 2)]


def test_steps_are_entered_together() -> None:
    entry = _Entry()
    assert _worker(entry).entries(list(STEPS)) == []
    assert entry.calls == [STEPS]


def test_steps_that_failed_together_are_left_to_enter_alone() -> None:
    entry = _Entry(ValueError("one step's fault"))
    assert _worker(entry).entries(list(STEPS)) == STEPS


def test_a_transient_failure_fails_every_step() -> None:
    entry = _Entry(sqlalchemy.exc.OperationalError("SELECT", {}, Exception("gone")))
    with pytest.raises(sqlalchemy.exc.OperationalError):
        _worker(entry).entries(list(STEPS))


def test_with_two_rounds_at_once_a_step_is_entered_beside_a_running_round() -> None:
    """FSM_WORKER_ROUNDS_AT_ONCE=2: a step that arrives alone does not wait for the round."""

    class Held(_Entry):
        def __init__(self) -> None:
            super().__init__()
            self.entered, self.release = threading.Event(), threading.Event()

        def enter_many(self, steps: list[Any]) -> list[Any]:
            super().enter_many(steps)
            if len(self.calls) == 1:
                self.entered.set()
                assert self.release.wait(5)
            return []

    entry = Held()
    worker = _worker(entry, Settings(worker_rounds_at_once=2))
    with ThreadPoolExecutor(2) as pool:
        first = pool.submit(worker.entries, [STEPS[0]])
        assert entry.entered.wait(5)
        assert worker.entries([STEPS[1]]) == []  # while the first round still runs
        assert not first.done()
        entry.release.set()
        assert first.result(5) == []
    assert entry.calls == [[STEPS[0]], [STEPS[1]]]
