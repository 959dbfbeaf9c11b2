"""An answer refused: recorded in the history and sent back to its agent to correct, within the
attempt (fsm_celery.core.correction decides it).

The state_ack_refused is sent once the transaction commits, as a state_cancel is, never with
the batch's state_tasks before it: an agent must hear only of a refusal that counts (one rolled
back would spend none of its corrections, and the agent would correct an answer the engine
never saw refused). A refusal lost after the commit (Redis away, the agent gone) strands
nothing: the attempt's deadline still runs, so the worst case is a timeout and a retry.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from fsm_celery.core.contract import summary
from fsm_celery.core.correction import REFUSED, Refusal
from fsm_celery.core.messages import ContractProblem, StateAckRefused, task_token
from fsm_celery.store import queries as q
from fsm_celery.store.rows import History
from fsm_celery.store.writes import Writes


def refuse(
    writes: Writes,
    row: q.AnyRow,
    refusal: Refusal,
    output: Mapping[str, Any],
    sender: UUID | None,
    secret: str,
) -> None:
    """Record the refusal and queue its state_ack_refused to the agent that sent the answer
    (else where the attempt's state_task went: the machine's agent, or its type's stream).
    Raises Unstorable, having recorded nothing, when its history row would not fit."""
    message = StateAckRefused(
        machine_id=row.id,
        machine_type=row.type,
        state=refusal.state,
        attempt=refusal.attempt,
        task_token=task_token(secret, row.id, refusal.state, refusal.attempt),
        problems=[ContractProblem(pointer=f.pointer, message=f.message) for f in refusal.flaws],
        corrections_left=refusal.corrections_left,
    )
    to = sender if sender is not None else row.agent_id
    agent = str(to) if to is not None else str(row.agent_type)
    writes.refuse(row, _record(writes, row, refusal, output), agent, message.to_wire())


def _record(writes: Writes, row: q.AnyRow, refusal: Refusal, output: Mapping[str, Any]) -> History:
    left = refusal.corrections_left
    return History(
        machine_id=row.id,
        from_state=refusal.state,
        to_state=refusal.state,
        success=False,
        output=dict(output),
        error_message=f"answer refused ({left} corrections left): {summary(refusal.flaws)}",
        duration_ms=None,
        attempt=refusal.attempt,
        event=REFUSED,
        actor=None,
        reason=None,
        progress=row.progress,
        agent_id=row.agent_id,
        tokens_used=0,
        cost=0.0,
        created_at=writes.now,
        machine_created_at=row.created_at,
        context_delta={},
        correction=refusal.correction,
    )
