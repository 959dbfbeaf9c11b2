"""A worker's buffered task events are published at most every EVENTS_LINGER (worker/events.py):
the first flush at once, the ones that follow within the linger put off, together, on the event
loop's timer. Flower still seeing every task is tests/integration/test_flower.py's."""

from __future__ import annotations

from typing import Any

import pytest
from celery.worker.consumer import consumer as celery_consumer

from fsm_celery.worker import events


class Hub:
    """The event loop's timer, as the consumer uses it: call_later only."""

    def __init__(self) -> None:
        self.later: list[tuple[float, Any, tuple[Any, ...]]] = []

    def call_later(self, delay: float, callback: Any, *args: Any) -> None:
        self.later.append((delay, callback, args))

    def fire(self) -> None:
        _, callback, args = self.later.pop(0)
        callback(*args)


class Dispatcher:
    def __init__(self) -> None:
        self.flushes = 0

    def flush(self) -> None:
        self.flushes += 1


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def consumer(monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Hub, Dispatcher, Clock]:
    events.apply()
    clock = Clock()
    monkeypatch.setattr(events.time, "monotonic", clock)
    consumer = celery_consumer.Consumer.__new__(celery_consumer.Consumer)
    hub, dispatcher = Hub(), Dispatcher()
    consumer.hub, consumer.event_dispatcher = hub, dispatcher
    return consumer, hub, dispatcher, clock


def test_a_flush_within_the_linger_is_put_off_once_and_takes_everything_then(
    consumer: tuple[Any, Hub, Dispatcher, Clock],
) -> None:
    c, hub, dispatcher, clock = consumer
    c._flush_events()
    assert dispatcher.flushes == 1 and hub.later == []  # the first at once
    clock.now += 0.005
    c._flush_events()
    clock.now += 0.005
    c._flush_events()
    assert dispatcher.flushes == 1  # put off
    assert [round(delay, 3) for delay, _, _ in hub.later] == [0.015]  # once, to the linger's end
    clock.now += 0.015
    hub.fire()
    assert dispatcher.flushes == 2
    clock.now += events.EVENTS_LINGER
    c._flush_events()
    assert dispatcher.flushes == 3 and hub.later == []  # an idle worker's: at once


def test_applying_it_twice_wraps_celerys_flush_once() -> None:
    events.apply()
    first = celery_consumer.Consumer._flush_events
    events.apply()
    assert celery_consumer.Consumer._flush_events is first
