"""What one transaction adds to the metrics, gathered before any instrument is touched: each
counter's additions by label set, each histogram's observations by bucket and their sum.

prometheus-client takes a lock (and, in multiprocess mode, writes a memory-mapped file) for
every increment, and looks a label set up for every labels() call: a hundred acks applied in one
batch would pay that a few hundred times. Gathered here, they are added once per label set and
bucket (`flush`)."""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable
from typing import Any

from fsm_celery.metrics.catalog import BY_NAME, Kind

Key = tuple[str, ...]  # the metric's name, then its labels' values
BOUNDS = {m.name: (*m.buckets, float("inf")) for m in BY_NAME.values() if m.kind is Kind.HISTOGRAM}


class Tally:
    __slots__ = ("counts", "observed")

    def __init__(self) -> None:
        self.counts: dict[Key, float] = {}
        self.observed: dict[Key, tuple[list[float], list[int]]] = {}

    def add(self, key: Key, by: float = 1.0) -> None:
        self.counts[key] = self.counts.get(key, 0.0) + by

    def observe(self, key: Key, value: float) -> None:
        found = self.observed.get(key)
        if found is None:
            found = self.observed[key] = ([0.0], [0] * len(BOUNDS[key[0]]))
        found[0][0] += value
        found[1][bisect_left(BOUNDS[key[0]], value)] += 1  # the first bound >= value

    def flush(self, child: Callable[[Key], Any]) -> None:
        """Add everything gathered to the instruments (`child`: a label set's, by key)."""
        for key, n in self.counts.items():
            child(key).inc(n)
        for key, (total, per_bucket) in self.observed.items():
            add_observations(child(key), total[0], per_bucket)


def add_observations(histogram: Any, total: float, per_bucket: list[int]) -> None:
    """Observations added to a histogram's label set at once: the count of each bucket (the
    first whose bound is at least the value, as Histogram.observe picks it) and their sum.
    prometheus-client's own parts of a histogram, `_sum` and `_buckets`: a unit test holds
    this to what observe() gives."""
    histogram._sum.inc(total)
    for bucket, n in zip(histogram._buckets, per_bucket, strict=True):
        if n:
            bucket.inc(n)
