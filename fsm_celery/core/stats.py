"""Attempt durations kept as histograms (pure): bucket b holds durations in
[GROWTH**(b-1), GROWTH**b) milliseconds (bucket 0: under a millisecond, bucket -1: no duration),
so that percentiles are read from a few dozen counters per state instead of a million rows,
to within the bucket's width (a quarter of its value)."""

from __future__ import annotations

import math
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

GROWTH = 1.25
NO_DURATION = -1
MAX_BUCKET = 150  # 1.25**150 ms is far past any attempt's limit
# Sums saturate at what their columns hold (BIGINT, a finite double): a total that stops at the
# largest value is a figure; one that overflows stops the fold and every read after it.
MOST = 2**63 - 1
MOST_COST = sys.float_info.max


def saturated(total: int) -> int:
    """A sum of whole numbers, at most what BIGINT holds."""
    return min(total, MOST)


def saturated_cost(total: float) -> float:
    """A sum of costs, finite (infinity and NaN, from rows stored before the bounds, too)."""
    return total if total <= MOST_COST else MOST_COST


def bucket_of(duration_ms: int | None) -> int:
    """The histogram bucket of a duration in milliseconds."""
    if duration_ms is None:
        return NO_DURATION
    if duration_ms < 1:
        return 0
    return min(MAX_BUCKET, int(math.log(duration_ms) / math.log(GROWTH)) + 1)


def bucket_bounds(bucket: int) -> tuple[float, float]:
    """The durations [low, high) a bucket counts, in milliseconds."""
    if bucket <= 0:
        return 0.0, 1.0
    return GROWTH ** (bucket - 1), GROWTH**bucket


@dataclass
class Tally:
    """Attempts of one state (or one machine type): how many, how many succeeded, and their
    durations as a histogram."""

    attempts: int = 0
    successes: int = 0
    duration_ms: int = 0  # the sum, for the mean
    histogram: Counter[int] = field(default_factory=Counter)

    def add(self, bucket: int, attempts: int, successes: int, duration_ms: int) -> None:
        self.attempts += attempts
        self.successes += successes
        self.duration_ms += duration_ms
        if bucket != NO_DURATION:
            self.histogram[bucket] += attempts

    def merge(self, other: Tally) -> None:
        self.attempts += other.attempts
        self.successes += other.successes
        self.duration_ms += other.duration_ms
        self.histogram.update(other.histogram)

    def percentile(self, q: float) -> float | None:
        """The duration below which a fraction q of the timed attempts fall (interpolated
        within its bucket), or None when none was timed."""
        return percentile(self.histogram, q)

    def summary(self) -> dict[str, float | int | None]:
        timed = sum(self.histogram.values())
        return {
            "attempts": self.attempts,
            "success_rate": round(self.successes / self.attempts, 4) if self.attempts else None,
            "mean_ms": round(self.duration_ms / timed, 1) if timed else None,
            "p50_ms": _rounded(self.percentile(0.5)),
            "p95_ms": _rounded(self.percentile(0.95)),
        }


def percentile(histogram: Mapping[int, int], q: float) -> float | None:
    total = sum(histogram.values())
    if total == 0:
        return None
    rank = q * total
    seen = 0
    for bucket in sorted(histogram):
        count = histogram[bucket]
        if seen + count >= rank:
            low, high = bucket_bounds(bucket)
            return low + (high - low) * ((rank - seen) / count if count else 0)
        seen += count
    return bucket_bounds(max(histogram))[1]


def tallies(rows: Iterable[tuple[str, str, int, int, int, int]]) -> dict[tuple[str, str], Tally]:
    """(type, state, bucket, attempts, successes, duration_ms) rows, summed per type and state."""
    found: dict[tuple[str, str], Tally] = {}
    for machine_type, state, bucket, attempts, successes, duration in rows:
        found.setdefault((machine_type, state), Tally()).add(bucket, attempts, successes, duration)
    return found


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 1)
