"""The engine's Observer (fsm_celery.engine.ports) that counts: what each committed transaction
did, read from its write-set (transitions in `log`, rejections, refused answers), as this
process's Prometheus instruments.

It is called on the hot path, after commit: a few dictionary reads per transition, the
instruments touched once per transaction and label set, nothing when a transaction moved
nothing. A failure to count is logged, never
raised (the transaction committed)."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from fsm_celery.core.transition import MachineStatus, RejectReason, Transition
from fsm_celery.core.usage import BUDGET_EXCEEDED
from fsm_celery.engine.ports import Inbound
from fsm_celery.metrics.instruments import instruments
from fsm_celery.metrics.tally import Key, Tally
from fsm_celery.store.writes import Writes

log = logging.getLogger(__name__)

# events that are an operator's or a rewind's, not the end of an attempt: timed as nothing
NOT_ATTEMPTS = frozenset({"pause", "resume", "cancel", "retry", "force", "rewind"})
RUNNING = MachineStatus.RUNNING.value
UNPROCESSABLE = RejectReason.UNPROCESSABLE.value


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
    if then is None:
        return None
    return (now - (then if then.tzinfo is not None else then.replace(tzinfo=UTC))).total_seconds()


class Counting:
    """Counts what the engine's transactions did, in this process's instruments: gathered per
    transaction (metrics.tally), then added once per label set and bucket; each label set's
    instrument looked up once per process."""

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self._m = instruments()
        self._children: dict[Key, Any] = {}
        self._roots: dict[str, str] = {}

    def _child(self, key: Key) -> Any:
        child = self._children.get(key)
        if child is None:
            metric = self._m[key[0]]
            child = self._children[key] = metric.labels(*key[1:]) if len(key) > 1 else metric
        return child

    def _root(self, machine_type: str) -> str:
        root = self._roots.get(machine_type)
        if root is None:
            root = self._roots[machine_type] = root_type(machine_type)
        return root

    def committed(self, writes: Writes, /) -> None:
        try:
            if not (writes.log or writes.rejections or writes.corrections):
                return
            tally = Tally()
            if writes.log:
                self._transitions(writes, tally)
            for rejection in writes.rejections:
                tally.add(("fsm_rejected_messages_total", rejection.reason))
                if rejection.reason == UNPROCESSABLE:
                    tally.add(("fsm_unprocessable_total",))
            for machine_id in writes.corrections:  # answers refused against their contract
                read = writes.read.get(machine_id)
                machine_type = self._root(read[0].type) if read is not None else "unknown"
                tally.add(("fsm_transitions_total", machine_type, self.mode, "refused"))
            tally.flush(self._child)
        except Exception:  # counting must never fail what committed
            log.exception("metrics: a committed transaction could not be counted")

    def _transitions(self, writes: Writes, tally: Tally) -> None:
        now, mode = writes.now, self.mode
        for row, t, event in writes.log:
            machine_type = self._root(row.type)
            kind = outcome(t, event)
            tally.add(("fsm_transitions_total", machine_type, mode, kind))
            if retried(t):
                tally.add(("fsm_retries_total", machine_type, t.from_state))
            if event == "timeout":
                tally.add(("fsm_timeouts_total", machine_type, t.from_state))
            if kind == "refused":
                tally.add(("fsm_budget_refusals_total", machine_type))
            if row.status != RUNNING or event in NOT_ATTEMPTS:
                continue
            took = seconds_since(row.entered_at, now)
            if took is not None and took >= 0:
                tally.observe(("fsm_attempt_duration_seconds", machine_type, t.from_state), took)
                if event == "join":
                    tally.observe(("fsm_join_seconds", machine_type), took)

    def acks_applied(self, writes: Writes, applied: Sequence[tuple[Any, Inbound]], /) -> None:
        """Each ack's time from its stream entry to its next state sent (inline: its
        state_task went before the commit) or handed on (celery: its fsm.enter_state task is
        sent right after)."""
        try:
            now, tally = time.time(), Tally()
            moves, entered, inline = writes.moves, writes.entered, self.mode == "inline"
            for message, item in applied:
                if item.stored_at is None:
                    continue
                move = moves.get(message.machine_id)
                if move is None or move.status != RUNNING or writes.delays.get(move.id):
                    continue  # nothing to enter, or a retry's backoff first
                if inline and move.id not in entered:
                    continue
                machine_type = self._root(writes.types.get(move.id, "unknown"))
                took = max(0.0, now - item.stored_at)
                tally.observe(("fsm_ack_to_task_seconds", machine_type, self.mode), took)
            tally.flush(self._child)
        except Exception:
            log.exception("metrics: a batch's acks could not be timed")

    def event(self, outcome: str, /) -> None:
        self._child(("fsm_events_total", outcome)).inc()
