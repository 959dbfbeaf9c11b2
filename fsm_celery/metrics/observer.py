"""The engine's Observer (fsm_celery.engine.ports) that counts: what each committed transaction
did, read from its write-set (transitions in `log`, rejections, refused answers), as this
process's Prometheus instruments.

It is called on the hot path, after commit: a few dictionary reads and counter increments per
transition, nothing when a transaction moved nothing. A failure to count is logged, never
raised (the transaction committed)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from fsm_celery.core.clock import aware
from fsm_celery.core.transition import MachineStatus, RejectReason, Transition
from fsm_celery.core.usage import BUDGET_EXCEEDED
from fsm_celery.engine.ports import Inbound
from fsm_celery.metrics.instruments import instruments
from fsm_celery.store.writes import Writes

log = logging.getLogger(__name__)

# events that are an operator's or a rewind's, not the end of an attempt: timed as nothing
NOT_ATTEMPTS = frozenset({"pause", "resume", "cancel", "retry", "force", "rewind"})
RUNNING = MachineStatus.RUNNING.value


def root_type(machine_type: str) -> str:
    """A fan-out child's `a.b.c` type counts under its root, `a` (labels stay few)."""
    return machine_type.split(".", 1)[0]


def outcome(t: Transition, event: str) -> str:
    """One transition's outcome label."""
    if event == "timeout":
        return "timed_out"
    if event == "handback":
        return "handed_back"
    if t.status is MachineStatus.CANCELLED:
        return "cancelled"
    if t.status is MachineStatus.PAUSED and (t.error or "").startswith(BUDGET_EXCEEDED):
        return "refused"
    if retried(t):
        return "retried"
    if t.failure is not None or t.status is MachineStatus.FAILED:
        return "failed"
    if t.success:
        return "succeeded"
    return "other"


def retried(t: Transition) -> bool:
    """Whether the transition is a failed attempt's retry (the same state, entered again)."""
    return (
        t.failure is not None and t.status is MachineStatus.RUNNING and t.to_state == t.from_state
    )


def seconds_since(then: datetime | None, now: datetime) -> float | None:
    start = aware(then) if then is not None else None
    return (now - start).total_seconds() if start is not None else None


class Counting:
    """Counts what the engine's transactions did, in this process's instruments."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._m = instruments()

    def committed(self, writes: Writes, /) -> None:
        try:
            if writes.log:
                self._transitions(writes)
            if writes.rejections:
                self._rejections(writes)
            if writes.corrections:
                self._refusals(writes)
        except Exception:  # counting must never fail what committed
            log.exception("metrics: a committed transaction could not be counted")

    def _transitions(self, writes: Writes) -> None:
        m, now = self._m, writes.now
        for row, t, event in writes.log:
            machine_type = root_type(row.type)
            kind = outcome(t, event)
            m["fsm_transitions_total"].labels(machine_type, self.mode, kind).inc()
            if retried(t):
                m["fsm_retries_total"].labels(machine_type, t.from_state).inc()
            if event == "timeout":
                m["fsm_timeouts_total"].labels(machine_type, t.from_state).inc()
            if kind == "refused":
                m["fsm_budget_refusals_total"].labels(machine_type).inc()
            if row.status != RUNNING or event in NOT_ATTEMPTS:
                continue
            took = seconds_since(row.entered_at, now)
            if took is not None and took >= 0:
                m["fsm_attempt_duration_seconds"].labels(machine_type, t.from_state).observe(took)
                if event == "join":
                    m["fsm_join_seconds"].labels(machine_type).observe(took)

    def _rejections(self, writes: Writes) -> None:
        m = self._m
        for rejection in writes.rejections:
            m["fsm_rejected_messages_total"].labels(rejection.reason).inc()
            if rejection.reason == RejectReason.UNPROCESSABLE.value:
                m["fsm_unprocessable_total"].inc()

    def _refusals(self, writes: Writes) -> None:
        """Answers refused against their state's contract: a transition refused, the machine
        waiting for the corrected answer."""
        for machine_id in writes.corrections:
            read = writes.read.get(machine_id)
            machine_type = root_type(read[0].type) if read is not None else "unknown"
            self._m["fsm_transitions_total"].labels(machine_type, self.mode, "refused").inc()

    def acks_applied(self, writes: Writes, applied: Sequence[tuple[Any, Inbound]], /) -> None:
        """Each ack's time from its stream entry to its next state sent (inline: its
        state_task went before the commit) or handed on (celery: its fsm.enter_state task is
        sent right after)."""
        try:
            now = time.time()
            moves, entered = writes.moves, writes.entered
            histogram = self._m["fsm_ack_to_task_seconds"]
            for message, item in applied:
                if item.stored_at is None:
                    continue
                move = moves.get(message.machine_id)
                if move is None or move.status != RUNNING or writes.delays.get(move.id):
                    continue  # nothing to enter, or a retry's backoff first
                if self.mode == "inline" and move.id not in entered:
                    continue
                machine_type = root_type(writes.types.get(move.id, "unknown"))
                histogram.labels(machine_type, self.mode).observe(max(0.0, now - item.stored_at))
        except Exception:
            log.exception("metrics: a batch's acks could not be timed")

    def event(self, outcome: str, /) -> None:
        self._m["fsm_events_total"].labels(outcome).inc()
