"""Scraping a process's /metrics in tests: its samples by name and labels."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable, Mapping

import httpx
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def scrape(url: str, headers: Mapping[str, str] | None = None) -> Samples:
    """Every sample the endpoint serves now."""
    response = httpx.get(url, headers=dict(headers or {}), timeout=10)
    response.raise_for_status()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(response.text)
        for sample in family.samples
    }


def total(samples: Samples, name: str, **labels: str) -> float:
    """The sum of the samples of that name whose labels include those given."""
    wanted = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and wanted <= ls)


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


def wait_for(
    url: str,
    ready: Callable[[Samples], bool],
    timeout: float = 30.0,
    headers: Mapping[str, str] | None = None,
) -> Samples:
    """The endpoint's samples once `ready` holds of them (it fails the test on timeout)."""
    deadline = time.monotonic() + timeout
    last: Samples = {}
    while True:
        try:
            last = scrape(url, headers)
            if ready(last):
                return last
        except httpx.HTTPError:
            pass  # not serving yet
        if time.monotonic() > deadline:
            moved = sorted(f"{n}{dict(ls)}={v}" for (n, ls), v in last.items() if n[:4] == "fsm_")
            raise AssertionError(f"{url} never got there; it served: {moved}")
        time.sleep(0.2)
