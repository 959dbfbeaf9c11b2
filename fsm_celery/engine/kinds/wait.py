"""The wait state kind, a state that waits for an outside event: an event kept for it decides
it at once, else it waits (its deadline set, nothing sent to any agent);
fsm_celery.engine.signals sends the events.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection

from fsm_celery.core import signal
from fsm_celery.core.attempt_events import EventArrived
from fsm_celery.core.definition import MachineDefinition, StateDefinition
from fsm_celery.core.transition import Limits, Rejected, RejectReason, decide
from fsm_celery.engine.kinds.base import Entering
from fsm_celery.engine.runtime import Runtime
from fsm_celery.exceptions import Unstorable
from fsm_celery.store import signals as store
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.writes import Writes


class Wait:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def enter_txn(self, at: Entering) -> None:
        """Enter a waiting state: the oldest event kept for it, if one fits, decides it at once;
        else it waits, its deadline set (the scan times it out). A kept event that does not fit
        (its payload against this state's schema, a guard it breaks) is consumed as refused."""
        conn, _, row, definition, state, writes, _ = at
        assert state.wait is not None
        name = state.wait.event
        while (kept := store.oldest_kept_txn(conn, row.id, name)) is not None:
            problem = signal.payload_problem(state.wait, kept.payload)
            moved = None
            if problem is None:
                moved = apply_txn(
                    conn,
                    definition,
                    state,
                    row,
                    kept.id,
                    name,
                    kept.payload,
                    kept.sender,
                    writes,
                    self._rt.limits,
                )
            if moved is not None:
                return
            store.consume_txn(conn, kept.id, writes.machine(row).attempt, writes.now, "refused")
        writes.entering(row.id, writes.now + state.timeout, row.agent_id)


def apply_txn(
    conn: Connection,
    definition: MachineDefinition,
    state: StateDefinition,
    row: AnyRow,
    event_id: int,
    name: str,
    payload: Mapping[str, Any],
    sender: str,
    writes: Writes,
    limits: Limits,
) -> str | None:
    """Decide the event at the machine's waiting state and record the transition; the state it
    moved to, or None when the decision refused it (recorded on writes.rejections)."""
    machine = writes.machine(row)
    event = EventArrived(state.name, machine.attempt, name, payload)
    decision = decide(definition, machine, event, limits)
    if isinstance(decision, Rejected):
        writes.reject(
            decision.reason, decision.detail, json.dumps(dict(payload)), machine_id=row.id
        )
        return None
    try:
        writes.transition(row, decision, "signal", actor=sender, reason=name)
    except Unstorable as exc:
        raw = json.dumps(dict(payload))
        writes.reject(RejectReason.INVALID_VALUE, exc.detail, raw, machine_id=row.id)
        return None
    store.consume_txn(conn, event_id, machine.attempt, writes.now, "applied")
    return decision.to_state
