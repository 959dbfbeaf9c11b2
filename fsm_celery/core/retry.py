"""The retry policy: how long to wait before a state is tried again. Pure."""

from __future__ import annotations

import hashlib
from uuid import UUID

from fsm_celery.core.definition import Backoff, Jitter


def retry_delay(backoff: Backoff, retry: int, unit: float) -> float:
    """Seconds before retry number `retry` (1-based); `unit` in [0, 1) places the jitter."""
    cap = backoff.max_delay.total_seconds()
    try:
        capped = min(backoff.delay.total_seconds() * backoff.rate ** (retry - 1), cap)
    except OverflowError:
        capped = cap
    return capped * unit if backoff.jitter is Jitter.FULL else capped


def jitter_unit(machine_id: UUID, attempt: int) -> float:
    """A number in [0, 1) fixed by machine and attempt: retries spread out, yet replay exactly."""
    digest = hashlib.sha256(f"{machine_id}:{attempt}".encode()).digest()
    return int.from_bytes(digest[:8], "big") / 2**64
