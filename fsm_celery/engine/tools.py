"""Tool states' calls (engine/kinds/tool.py enters them): what a call is to send, read before
it is made, and what it came to, applied as the attempt's answer in a transaction of its own
with the machine's row locked (and its ancestors': a fan-out's child joins its parent). The
decision is fsm_celery.core.transition's, as an agent's ack: the state's contract, retries,
backoff and edges hold alike. The history row is an `ack` whose actor is the tool
(`mcp:server/tool`), its reason the arguments it was called with."""

from __future__ import annotations

import json
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core import tool
from fsm_celery.core.attempt_events import Ack
from fsm_celery.core.clock import aware
from fsm_celery.core.prompt import PromptError
from fsm_celery.core.steps import Next
from fsm_celery.core.transition import MachineStatus, Rejected, RejectReason, decide
from fsm_celery.engine.usecase import MovingUseCase
from fsm_celery.exceptions import Unstorable
from fsm_celery.store import queries as q
from fsm_celery.store.writes import Writes

REASON_CHARS = 2000  # of the arguments as the history row's reason


@dataclass(frozen=True)
class Pending:
    """A call to make: for which attempt, to which tool, with what, by when."""

    machine_id: UUID
    machine_type: str
    state: str
    attempt: int
    call: tool.ToolCall
    arguments: dict[str, Any]
    deadline: datetime
    declares_contract: bool  # else the tool's own output schema, if it has one, is checked


class Tools(MovingUseCase):
    def pending(self, machine_id: UUID, attempt: int) -> Pending | None:
        """The call the attempt is to make, or None when there is none to make: the machine
        moved on, or is paused, cancelled or ended (a stale or repeated fsm.call_tool), or
        its arguments no longer render (the entry checked them: its context is the same)."""
        with self._rt.db.connect() as conn:
            row = q.get_machine_txn(conn, machine_id)
            if row is None or row.attempt != attempt or row.status != MachineStatus.RUNNING:
                return None
            definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        state = definition.states_by_name.get(row.current_state)
        deadline = aware(row.deadline_at)
        if state is None or state.tool is None or deadline is None:
            return None
        try:
            arguments = tool.arguments(state.tool, row.context, self._rt.settings.max_payload_bytes)
        except PromptError:
            return None
        return Pending(
            machine_id=row.id,
            machine_type=row.type,
            state=state.name,
            attempt=attempt,
            call=state.tool,
            arguments=arguments,
            deadline=deadline,
            declares_contract=state.output_schema is not None or bool(state.required_output),
        )

    def finish(self, pending: Pending, outcome: tool.Outcome) -> Next:
        """Apply what the call came to as the attempt's answer; the states it leads to (an
        unknown or moved-on machine, or an answer the database cannot keep, is recorded as a
        rejected message, nothing moved)."""
        writes = Writes(self._rt.clock())
        raw = json.dumps(_record(pending, outcome), default=str)
        with self._rt.transaction(writes) as conn:
            rows = q.lock_machines_txn(conn, [pending.machine_id])
            row = rows.get(pending.machine_id)
            if row is None:
                detail = f"no machine {pending.machine_id}"
                writes.reject(
                    RejectReason.UNKNOWN_MACHINE,
                    detail,
                    raw,
                    machine_id=pending.machine_id,
                    state=pending.state,
                    attempt=pending.attempt,
                )
            else:
                self._apply(conn, row, pending, outcome, writes, raw)
            self._entry.finish_txn(conn, rows, writes)
        return writes.next()

    def _apply(
        self,
        conn: Connection,
        row: q.AnyRow,
        pending: Pending,
        outcome: tool.Outcome,
        writes: Writes,
        raw: str,
    ) -> None:
        definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        machine = writes.machine(row)
        where: dict[str, Any] = {
            "machine_id": row.id,
            "state": pending.state,
            "attempt": pending.attempt,
        }
        ack = Ack(pending.state, pending.attempt, outcome.success, outcome.output, outcome.error)
        decision = decide(definition, machine, ack, self._rt.limits)
        if isinstance(decision, Rejected):
            writes.reject(decision.reason, decision.detail, raw, **where)
            return
        try:
            writes.transition(
                row, decision, "ack", actor=tool.actor(pending.call), reason=_reason(pending)
            )
        except Unstorable as exc:
            writes.reject(RejectReason.INVALID_VALUE, exc.detail, raw, **where)


def _reason(pending: Pending) -> str:
    text = json.dumps(pending.arguments, default=str, ensure_ascii=False)
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def _record(pending: Pending, outcome: tool.Outcome) -> dict[str, Any]:
    """The call's result as a rejected message keeps it, when it moved nothing."""
    return {
        "type": "tool_result",
        "machineId": str(pending.machine_id),
        "state": pending.state,
        "attempt": pending.attempt,
        "tool": tool.actor(pending.call),
        "success": outcome.success,
        "output": outcome.output,
        "error": outcome.error,
    }
