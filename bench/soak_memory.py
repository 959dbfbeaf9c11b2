"""The soak's memory figures (bench/soak.py): the RSS of every long-lived process, sampled over
the run, and whether it stayed flat.

A process is sampled as a tree (a supervised worker is a shell loop and Celery's process under
it; a bridge, its processes), one series per process started: a killed and restarted copy
begins a series of its own. "Flat" is judged on series long enough to say: the median of their
last third against the median of their first third, within GROWTH (a fraction) or SLACK_MB,
whichever is larger. A series judged spans MIN_SPAN_S at least, so that its first third (the
process importing, connecting and warming its caches, a minute or two) is mostly past the
warm-up: a process that only warms up is flat and one that keeps growing is not. Shorter
series (a smoke run's, a restarted copy's) are reported with their figures and not judged.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import psutil

GROWTH = 0.10  # of the first third's median
SLACK_MB = 10.0
MIN_SAMPLES = 9  # three a third, at least
MIN_SHARE = 1 / 3  # of the run's samples: a shorter series is reported, not judged
MIN_SPAN_S = 600.0  # seconds from a series' first sample to its last, to be judged
TREND_POINTS = 12  # samples a series' trend shows, evenly spaced: a plateau told from a climb


def tree_mb(pid: int, kind: str = "rss", tree: bool = True) -> float | None:
    """The memory of a process and its descendants (tree) in MiB, summed: RSS, or USS (its
    pages no other process shares: PostgreSQL's backends share its buffers, which RSS counts
    once for each backend that touched them); None once it is gone."""
    try:
        parent = psutil.Process(pid)
        members = [parent, *(parent.children(recursive=True) if tree else ())]
    except psutil.Error:
        return None
    total = 0
    for member in members:
        with contextlib.suppress(psutil.Error):  # it exited meanwhile
            info = member.memory_full_info() if kind == "uss" else member.memory_info()
            total += getattr(info, kind)
    return round(total / 2**20, 1) if total else None  # 0: exiting, its memory already freed


@dataclass
class Series:
    """One process's samples: (seconds since the sampling began, MiB)."""

    name: str
    samples: list[tuple[float, float]] = field(default_factory=list)


def verdict(values: list[float], run_samples: int, span: float = MIN_SPAN_S) -> dict[str, object]:
    """The figures of one series sampled over `span` seconds, and whether it is flat (None:
    too short to judge)."""
    if not values:
        return {"samples": 0, "flat": None}
    third = len(values) // 3
    figures: dict[str, object] = {
        "samples": len(values),
        "first_mb": values[0],
        "last_mb": values[-1],
        "max_mb": max(values),
        "trend_mb": [
            values[i * (len(values) - 1) // (TREND_POINTS - 1)] for i in range(TREND_POINTS)
        ]
        if len(values) >= TREND_POINTS
        else list(values),
        "flat": None,
    }
    too_few = len(values) < MIN_SAMPLES or len(values) < run_samples * MIN_SHARE
    if too_few or span < MIN_SPAN_S:
        return figures
    early = statistics.median(values[:third])
    late = statistics.median(values[-third:])
    bound = max(early * GROWTH, SLACK_MB)
    figures.update(
        first_third_median_mb=round(early, 1),
        last_third_median_mb=round(late, 1),
        bound_mb=round(bound, 1),
        flat=late - early <= bound,
    )
    return figures


class Sampler(threading.Thread):
    """Samples the processes `targets` names (name, pid: each with its descendants; asked anew
    each time) every `interval` seconds until stopped, and this process on its own. PostgreSQL
    (a name starting `postgres`) is sampled by USS, the others by RSS."""

    def __init__(self, targets: Callable[[], Iterable[tuple[str, int]]], interval: float) -> None:
        super().__init__(daemon=True, name="soak-memory")
        self.targets = targets
        self.interval = interval
        self.series: dict[tuple[str, int], Series] = {}
        self.rounds = 0
        self._stopping = threading.Event()
        self._began = time.monotonic()

    def run(self) -> None:
        while not self._stopping.is_set():
            self.sample()
            self._stopping.wait(self.interval)

    def sample(self) -> None:
        at = round(time.monotonic() - self._began, 1)
        with contextlib.suppress(Exception):  # a target list read mid-restart: next round
            self._record(at, "soak", os.getpid(), tree_mb(os.getpid(), tree=False))
            for name, pid in self.targets():
                kind = "uss" if name.startswith("postgres") else "rss"
                self._record(at, name, pid, tree_mb(pid, kind))
        self.rounds += 1

    def _record(self, at: float, name: str, pid: int, mb: float | None) -> None:
        if mb is not None:
            self.series.setdefault((name, pid), Series(f"{name}#{pid}")).samples.append((at, mb))

    def stop(self) -> None:
        self._stopping.set()
        self.join(30)

    def report(self) -> dict[str, dict[str, object]]:
        """Every series' figures, by its name (process name # pid)."""
        return {
            series.name: verdict(
                [mb for _, mb in series.samples],
                self.rounds,
                series.samples[-1][0] - series.samples[0][0] if series.samples else 0.0,
            )
            for series in self.series.values()
        }
