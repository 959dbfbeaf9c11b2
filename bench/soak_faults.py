"""The soak's faults (bench/soak.py): which, and when, drawn from the seed.

The schedule is pure: the same seed, length and kinds give the same faults at the same times,
so a run that found something can be run again. Faults are drawn in rounds, each round every
kind once in a shuffled order, so that a short run still meets every kind and a long one meets
each as often as the others; the gap before each fault is uniform in EVERY seconds. The soak
carries them out one at a time: a fault due while the previous one is still being repaired (a
failover takes seconds) waits for it, so the counts the report gives are those carried out.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass

# Each fault kind, and what the soak does for it (bench/soak_stack.py carries them out).
KINDS: dict[str, str] = {
    "kill_worker": "SIGKILL a celery worker (its tasks mid-transaction), start another",
    "kill_bridge": "SIGKILL an ack bridge's processes (mid-batch), start another",
    "kill_beat": "SIGKILL celery beat (the scan's clock), start another",
    "kill_agent": "SIGKILL an agent with tasks in hand, start it again under its id",
    "kill_dashboard": "SIGKILL a dashboard (mid-request), start another",
    "redis_flush": "FLUSHALL on the Redis primary: every queue, stream and group lost",
    "postgres_restart": "restart PostgreSQL (fast shutdown: every connection dropped)",
    "sentinel_failover": "SIGKILL the Redis primary: the sentinels promote the replica; the "
    "old primary comes back as a replica",
}
BROKER_KINDS: dict[str, str] = {
    "broker_restart": "SIGKILL the RabbitMQ broker (its queues as it persisted them), start it",
}
EVERY = (4.0, 10.0)  # seconds between two faults, drawn uniformly


@dataclass(frozen=True)
class Fault:
    """One fault: when (seconds after the load began) and which kind."""

    at: float
    kind: str


def kinds_for(broker: str) -> tuple[str, ...]:
    """The fault kinds of a run on that broker (redis: Celery's broker is the Redis of the
    acks; amqp: RabbitMQ, which is restarted too)."""
    if broker == "amqp":
        return (*KINDS, *BROKER_KINDS)
    return tuple(KINDS)


def schedule(
    seed: int,
    seconds: float,
    kinds: Sequence[str],
    every: tuple[float, float] = EVERY,
) -> list[Fault]:
    """The faults of a run of that many seconds: in rounds of every kind once, shuffled by the
    seed, each after a gap drawn from `every`; none at or past the end."""
    low, high = every
    if not kinds:
        raise ValueError("a fault schedule needs at least one kind of fault")
    if not 0 < low <= high:
        raise ValueError(f"the gap between faults must be 0 < low <= high, not {every}")
    unknown = sorted(set(kinds) - set(KINDS) - set(BROKER_KINDS))
    if unknown:
        raise ValueError(f"unknown fault kinds {unknown}: known are {[*KINDS, *BROKER_KINDS]}")
    rng = random.Random(seed)
    faults: list[Fault] = []
    bag: list[str] = []
    at = rng.uniform(low, high)
    while at < seconds:
        if not bag:
            bag = list(kinds)
            rng.shuffle(bag)
        faults.append(Fault(round(at, 3), bag.pop()))
        at += rng.uniform(low, high)
    return faults
