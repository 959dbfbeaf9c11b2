"""The retry backoff policy."""

from __future__ import annotations

import uuid
from datetime import timedelta

from fsm_celery.core.definition import Backoff, Jitter
from fsm_celery.core.retry import jitter_unit, retry_delay

NO_JITTER = Backoff(
    delay=timedelta(seconds=2), rate=3, max_delay=timedelta(seconds=60), jitter=Jitter.NONE
)


def test_delay_grows_by_the_rate_from_the_first_interval() -> None:
    assert [retry_delay(NO_JITTER, n, 0.5) for n in (1, 2, 3)] == [2, 6, 18]


def test_delay_is_capped() -> None:
    assert retry_delay(NO_JITTER, 4, 0.5) == 54
    assert retry_delay(NO_JITTER, 5, 0.5) == 60
    assert retry_delay(NO_JITTER, 10_000, 0.5) == 60  # no overflow however many retries


def test_full_jitter_scales_the_delay_by_the_unit() -> None:
    full = NO_JITTER.model_copy(update={"jitter": Jitter.FULL})
    assert retry_delay(full, 2, 0.25) == 1.5
    assert retry_delay(full, 2, 0.0) == 0.0


def test_jitter_is_fixed_by_machine_and_attempt() -> None:
    machine = uuid.uuid4()
    assert jitter_unit(machine, 3) == jitter_unit(machine, 3)
    units = {jitter_unit(machine, attempt) for attempt in range(100)}
    assert len(units) == 100 and all(0 <= u < 1 for u in units)
