"""Time travel that moves machines. Rewind: a machine put back at a past step's state, with the
context it had after that step (reconstructed from the history's changes:
fsm_celery.core.timeline) and an operator's edits, entered as a new attempt; the audit row names
who and why, the history before it stays; the attempt in flight is cancelled, so its late ack is
refused as stale and recorded. Fork: a new machine started at a past step of another, with that
step's context and edits, linked to it (forked_from, forked_at); the source is untouched."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core import timeline
from fsm_celery.core.admin import decide_rewind
from fsm_celery.core.context import edited_problem
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.steps import Next, Step
from fsm_celery.core.transition import MachineStatus, Rejected
from fsm_celery.engine.admin import checked_context
from fsm_celery.engine.cancels import cancel_in_flight
from fsm_celery.engine.usecase import MovingUseCase, UseCase
from fsm_celery.exceptions import CommandRefused, MachineNotFound, StepNotFound, Unstorable
from fsm_celery.store import fanouts
from fsm_celery.store import queries as q
from fsm_celery.store.rows import NewMachine
from fsm_celery.store.writes import Writes, snapshot, start_record


@dataclass(frozen=True, slots=True)
class Rewound:
    """A rewind done: the step of the history row it wrote, and the states it left to enter."""

    step: int
    next: Next


class Rewind(MovingUseCase):
    def rewind(
        self,
        machine_id: UUID,
        step: int,
        actor: str,
        reason: str,
        edits: Mapping[str, Any] | None = None,
    ) -> Rewound:
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
            state, context = _after_step(
                conn, "rewind", machine_id, step, edits, self._rt.settings.max_context_bytes
            )
            definition = self._rt.catalog.version(conn, row.type, row.definition_version)
            _check_edits("rewind", machine_id, definition, edits, context)
            decision = decide_rewind(definition, snapshot(row), state, context)
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
        return Rewound(row.attempt, writes.next())  # its row is the attempt it interrupted


def _after_step(
    conn: Connection,
    action: str,
    machine_id: UUID,
    step: int,
    edits: Mapping[str, Any] | None,
    max_bytes: int,
) -> tuple[str, dict[str, Any]]:
    """The state the machine was in after `step` and the context it had then, the edits over it
    (checked as a starting context is); StepNotFound, or CommandRefused when its history kept
    no contexts that far back."""
    steps = q.context_deltas_txn(conn, machine_id, step)
    if not steps or steps[-1].attempt != step:
        raise StepNotFound(str(machine_id), step, steps[-1].attempt if steps else None)
    then = timeline.context_at(r.context_delta for r in steps)
    if then is None:
        raise CommandRefused(
            action, str(machine_id), "its history before that step kept no contexts"
        )
    return steps[-1].to_state, checked_context({**then, **dict(edits or {})}, max_bytes)


def _check_edits(
    action: str,
    machine_id: UUID,
    definition: MachineDefinition,
    edits: Mapping[str, Any] | None,
    context: Mapping[str, Any],
) -> None:
    """Refuse edits that make a context the definition's context_schema does not accept
    (before anything is written); a rewind or fork without edits keeps the context it had."""
    if not edits or definition.context_schema is None:
        return
    problem = edited_problem(definition.context_schema, context)
    if problem is not None:
        detail = f"the edits do not match {definition.type}'s context_schema: {problem}"
        raise CommandRefused(action, str(machine_id), detail)


def _why_not(row: q.AnyRow, step: int) -> str | None:
    if row.parent_id is not None:
        return "it is a fan-out's child: rewind the machine at its root"
    if step >= row.attempt:
        return f"step {step} is not in its past (it is at step {row.attempt})"
    return None


class Fork(UseCase):
    def fork(
        self,
        source_id: UUID,
        step: int,
        actor: str,
        reason: str,
        edits: Mapping[str, Any] | None = None,
    ) -> Step:
        """Start a machine at the state `source_id` was in after `step`, with the context it had
        then and `edits` over it (the source's definition version and budget); its first
        state to enter. The source is read, never changed."""
        writes = Writes(self._rt.clock())
        with self._rt.transaction(writes) as conn:
            source = q.get_machine_txn(conn, source_id)
            if source is None:
                raise MachineNotFound(str(source_id))
            if source.parent_id is not None:
                raise CommandRefused(
                    "fork", str(source_id), "it is a fan-out's child: fork its root"
                )
            name, context = _after_step(
                conn, "fork", source_id, step, edits, self._rt.settings.max_context_bytes
            )
            definition = self._rt.catalog.version(conn, source.type, source.definition_version)
            _check_edits("fork", source_id, definition, edits, context)
            state = definition.state(name)
            if state.terminal is not None:
                raise CommandRefused(
                    "fork",
                    str(source_id),
                    f"that step ended it in {state.name}: fork from a step before it",
                )
            machine = NewMachine(
                id=uuid.uuid4(),
                type=source.type,
                agent_type=definition.agent_type_of(state),
                current_state=state.name,
                context=context,
                status=MachineStatus.RUNNING.value,
                github_issue=source.github_issue,
                created_at=writes.now,
                updated_at=writes.now,
                definition_version=source.definition_version,
                agent_id=source.agent_id if source.agent_pinned else None,
                agent_pinned=bool(source.agent_pinned),
                budget_tokens=source.budget_tokens,
                budget_cost=source.budget_cost,
                attempt=1,
                state_retries=0,
                dispatch_due_at=writes.now,
                forked_from=source_id,
                forked_at=step,
            )
            why = f"from {source_id} step {step}" + (f": {reason}" if reason else "")
            started = replace(start_record(machine, actor, why), event="fork")
            q.insert_machine_txn(conn, machine)
            q.insert_transitions_txn(conn, [started])
            writes.announce(started, machine, machine.status)
        return Step(machine.id, 1, 0.0, state.name, machine.type)
