"""Telling an agent to drop an attempt the engine superseded (an operator's command, a
timeout): its ack would be refused as stale, and meanwhile it would hold one of the agent's
slots and heartbeat for nothing."""

from __future__ import annotations

from fsm_celery.core.messages import StateCancel, task_token
from fsm_celery.core.transition import MachineStatus
from fsm_celery.store import queries as q
from fsm_celery.store.writes import Writes

REASON_CHARS = 2000  # of a state_cancel's reason, as an agent's own texts are bounded


def cancel_in_flight(writes: Writes, row: q.AnyRow, secret: str, reason: str) -> None:
    """Queue a state_cancel for the row's attempt, sent once the transaction commits, if that
    attempt is in flight: the machine runs and its state_task was sent (not waiting out a retry
    delay). `row` is the machine as locked, before this transaction moved it."""
    if row.status != MachineStatus.RUNNING.value or row.dispatch_due_at is not None:
        return
    cancel = StateCancel(
        machine_id=row.id,
        state=row.current_state,
        attempt=row.attempt,
        task_token=task_token(secret, row.id, row.current_state, row.attempt),
        reason=reason[:REASON_CHARS],
    )
    # Where its state_task went: the machine's agent, else its type's stream.
    agent = str(row.agent_id) if row.agent_id is not None else str(row.agent_type)
    writes.out.cancels.append((agent, cancel.to_wire()))
