"""Durations as histograms: buckets, percentiles and tallies (pure)."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsm_celery.core.stats import (
    GROWTH,
    MAX_BUCKET,
    NO_DURATION,
    Tally,
    bucket_bounds,
    bucket_of,
    percentile,
)


@given(st.integers(min_value=0, max_value=10**12))
def test_a_duration_falls_inside_its_buckets_bounds(ms: int) -> None:
    low, high = bucket_bounds(bucket_of(ms))
    assert low <= ms < high or bucket_of(ms) == MAX_BUCKET


def test_no_duration_has_a_bucket_of_its_own_that_percentiles_ignore() -> None:
    tally = Tally()
    tally.add(NO_DURATION, attempts=3, successes=0, duration_ms=0)
    assert bucket_of(None) == NO_DURATION
    assert tally.percentile(0.5) is None and tally.summary()["success_rate"] == 0.0


@pytest.mark.parametrize("ms", [1, 7, 250, 30_000, 3_600_000])
def test_a_percentile_is_within_one_bucket_of_the_truth(ms: int) -> None:
    found = percentile(Counter({bucket_of(ms): 100}), 0.5)
    assert found is not None and ms / GROWTH <= found <= ms * GROWTH


def test_p95_reads_the_slow_tail() -> None:
    histogram = Counter({bucket_of(10): 90, bucket_of(5_000): 10})
    p50, p95 = percentile(histogram, 0.5), percentile(histogram, 0.95)
    assert p50 is not None and p50 < 20
    assert p95 is not None and 5_000 / GROWTH <= p95 <= 5_000 * GROWTH


def test_tallies_merge_as_if_counted_together() -> None:
    a, b, both = Tally(), Tally(), Tally()
    for tally, ms in ((a, 10), (b, 1000)):
        tally.add(bucket_of(ms), 1, 1, ms)
        both.add(bucket_of(ms), 1, 1, ms)
    a.merge(b)
    assert a.summary() == both.summary() and a.summary()["mean_ms"] == 505.0
