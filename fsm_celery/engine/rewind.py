"""Rewind: a machine put back at a past step's state, with the context it had after that step
(reconstructed from the history's changes: fsm_celery.core.timeline) and an operator's edits,
entered as a new attempt; the audit row names who and why, the history before it stays. The
attempt in flight is cancelled, so its late ack is refused as stale and recorded."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from fsm_celery.core import timeline
from fsm_celery.core.admin import decide_rewind
from fsm_celery.core.transition import Rejected
from fsm_celery.engine.admin import checked_context
from fsm_celery.engine.cancels import cancel_in_flight
from fsm_celery.engine.entry import Entry
from fsm_celery.engine.ports import Next
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.writes import Writes, snapshot
from fsm_celery.exceptions import CommandRefused, MachineNotFound, StepNotFound, Unstorable
from fsm_celery.store import fanouts
from fsm_celery.store import queries as q


class Rewind:
    def __init__(self, runtime: Runtime, entry: Entry) -> None:
        self._rt = runtime
        self._entry = entry

    def rewind(
        self,
        machine_id: UUID,
        step: int,
        actor: str,
        reason: str,
        edits: Mapping[str, Any] | None = None,
    ) -> Next:
        """Put the machine back at the state it was in after `step`, with that step's context
        and `edits` over it; CommandRefused, with the reason, when it cannot be."""
        writes = Writes(self._rt.clock())
        with self._rt.transaction(writes) as conn:
            rows = q.lock_machines_txn(conn, [machine_id], ancestors=True)
            row = rows.get(machine_id)
            if row is None:
                raise MachineNotFound(str(machine_id))
            refused = _why_not(row, step)
            if refused is None and fanouts.open_fan_out_txn(conn, machine_id) is not None:
                refused = "its children are at work: cancel them (or the machine) first"
            if refused is not None:
                raise CommandRefused("rewind", str(machine_id), refused)
            steps = q.context_deltas_txn(conn, machine_id, step)
            if not steps or steps[-1].attempt != step:
                raise StepNotFound(str(machine_id), step, steps[-1].attempt if steps else None)
            then = timeline.context_at(r.context_delta for r in steps)
            if then is None:
                raise CommandRefused(
                    "rewind", str(machine_id), "its history before that step kept no contexts"
                )
            context = checked_context(
                {**then, **dict(edits or {})}, self._rt.settings.max_context_bytes
            )
            definition = self._rt.catalog.version(conn, row.type, row.definition_version)
            decision = decide_rewind(definition, snapshot(row), steps[-1].to_state, context)
            if isinstance(decision, Rejected):
                raise CommandRefused("rewind", str(machine_id), decision.detail)
            why = f"to step {step}" + (f": {reason}" if reason else "")
            try:
                writes.transition(row, decision, "rewind", actor=actor, reason=why)
            except Unstorable as exc:
                raise CommandRefused("rewind", str(machine_id), exc.detail) from exc
            secret = self._rt.settings.token_secrets[0]
            cancel_in_flight(writes, row, secret, f"rewound by {actor} {why}")
            self._entry.enter_due_txn(conn, rows, writes)
            self._entry.send_and_write(conn, writes)
        return writes.next()


def _why_not(row: q.AnyRow, step: int) -> str | None:
    if row.parent_id is not None:
        return "it is a fan-out's child: rewind the machine at its root"
    if step >= row.attempt:
        return f"step {step} is not in its past (it is at step {row.attempt})"
    return None
