"""What people do to machines: start them, command them (pause, resume, cancel, retry, force),
and set their budgets. The decisions are fsm_celery.core.admin's; this carries them out."""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any, TypeGuard
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core.admin import Action, Command, decide_command
from fsm_celery.core.context import context_problem
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.messages import INT32_MAX, unstorable
from fsm_celery.core.start_key import (
    KeyedStart,
    Started,
    checked_key,
    context_digest,
    differences,
)
from fsm_celery.core.steps import Next, Step
from fsm_celery.core.transition import (
    LOOP_COUNT,
    LOOP_LIMIT,
    MachineStatus,
    Rejected,
    initial_context,
)
from fsm_celery.core.usage import BUDGET_EXCEEDED, Budget
from fsm_celery.engine.cancels import cancel_in_flight
from fsm_celery.engine.usecase import MovingUseCase
from fsm_celery.exceptions import (
    ARCHIVED,
    CommandRefused,
    ContextMismatch,
    InvalidAgentId,
    InvalidContext,
    MachineNotFound,
    StartKeyReused,
    Unstorable,
)
from fsm_celery.store import queries as q
from fsm_celery.store import start_keys as keys
from fsm_celery.store.rows import NewMachine
from fsm_celery.store.writes import Rows, Writes, snapshot, start_record


class Admin(MovingUseCase):
    def start(
        self,
        machine_type: str,
        context: Mapping[str, Any] | None = None,
        agent_id: UUID | str | None = None,
        github_issue: int | None = None,
        key: str | None = None,
    ) -> Started:
        """Create a running machine in its initial state, whose one step is that state, to
        enter; or, when a start with the key made one already, that machine and no step."""
        writes = Writes(self._rt.clock())
        with self._rt.transaction(writes) as conn:
            return self.start_txn(conn, writes, machine_type, context, agent_id, github_issue, key)

    def start_txn(
        self,
        conn: Connection,
        writes: Writes,
        machine_type: str,
        context: Mapping[str, Any] | None = None,
        agent_id: UUID | str | None = None,
        github_issue: int | None = None,
        key: str | None = None,
    ) -> Started:
        """start, in the caller's transaction (a schedule's tick is recorded in the same): the
        machine is written at once, its start event queued on writes.

        With a key, the start is idempotent: the key, taken in this transaction, holds what
        the start asked; a start repeated with it finds the machine the first made, whatever
        that machine's status, and enters nothing; one that asks another type, context, agent
        or issue is refused (StartKeyReused) and writes nothing. Everything is checked before
        the key is taken, except against the definition when the key is held: a repeat keeps
        its answer after the definition changed."""
        given = None if key is None else checked_key(key)
        context = checked_context(context, self._rt.settings.max_context_bytes)
        agent = _agent_uuid(agent_id)
        asked = None
        if given is not None:
            asked = KeyedStart(given, machine_type, context_digest(context), agent, github_issue)
            found = _found_txn(conn, asked)
            if found is not None:
                return found
        version, definition = self._rt.catalog.latest(conn, machine_type)
        _check_schema(definition, context)
        machine_id = uuid.uuid4()
        if asked is not None and not keys.claim_txn(conn, asked, machine_id, writes.now):
            found = _found_txn(conn, asked)  # taken while this waited: that start's machine
            assert found is not None  # a key is deleted only with its machine
            return found
        issue = github_issue if github_issue is not None else context.get("githubIssue")
        machine = _new_machine(
            machine_id,
            machine_type,
            version,
            definition,
            context,
            agent,
            issue if _fits_int32(issue) else None,
            writes.now,
        )
        started = start_record(machine)
        q.insert_machine_txn(conn, machine)
        q.insert_transitions_txn(conn, [started])
        writes.announce(started, machine, machine.status)
        step = Step(machine_id, 1, 0.0, definition.initial_state, machine_type)
        return Started(machine_id, step)

    def command(self, machine_id: UUID, command: Command) -> Next:
        """Apply an operator's command; raises CommandRefused when it does not apply."""
        writes = Writes(self._rt.clock())
        with self._rt.transaction(writes) as conn:
            rows, row = _lock_one(conn, machine_id)
            definition = self._rt.catalog.version(conn, row.type, row.definition_version)
            last = q.last_transition_txn(conn, machine_id)
            if last is None:  # every machine has its start's row: its month was archived
                raise CommandRefused(command.action.value, str(machine_id), ARCHIVED)
            decision = decide_command(
                definition, snapshot(row), command, last.from_state if last else None
            )
            if isinstance(decision, Rejected):
                raise CommandRefused(command.action.value, str(machine_id), decision.detail)
            try:
                writes.transition(
                    row, decision, command.action.value, actor=command.actor, reason=command.reason
                )
            except Unstorable as exc:
                raise CommandRefused(command.action.value, str(machine_id), exc.detail) from exc
            secret = self._rt.settings.token_secrets[0]
            cancel_in_flight(writes, row, secret, _cancel_reason(command))
            self._entry.enter_due_txn(conn, rows, writes)  # children follow (engine.kinds.joins)
            self._entry.send_and_write(conn, writes)
        return writes.next()

    def set_budget(self, machine_id: UUID, budget: Budget, actor: str, reason: str = "") -> Next:
        """Change the machine's budget (audited: who, why, from what); one paused for its budget
        resumes if now within it."""
        writes = Writes(self._rt.clock())
        with self._rt.transaction(writes) as conn:
            rows, row = _lock_one(conn, machine_id)
            q.set_budget_txn(conn, machine_id, budget.tokens, budget.cost)
            q.record_budget_change_txn(
                conn,
                machine_id,
                actor=actor,
                reason=reason,
                tokens=budget.tokens,
                cost=budget.cost,
                previous_tokens=row.budget_tokens,
                previous_cost=row.budget_cost,
                created_at=writes.now,
            )
            machine = replace(snapshot(row), budget=budget)
            paused_for_budget = (row.error or "").startswith(BUDGET_EXCEEDED)
            if machine.status is not MachineStatus.PAUSED or not paused_for_budget:
                return []
            if budget.exceeded_by(machine.usage) is not None:
                return []
            why = f"budget raised to tokens={budget.tokens}, cost={budget.cost}"
            command = Command(Action.RESUME, actor, f"{why}: {reason}" if reason else why)
            definition = self._rt.catalog.version(conn, row.type, row.definition_version)
            decision = decide_command(definition, machine, command)
            assert not isinstance(decision, Rejected)  # a paused machine can always resume
            writes.transition(row, decision, "resume", actor=actor, reason=command.reason)
            self._entry.enter_due_txn(conn, rows, writes)
            self._entry.send_and_write(conn, writes)
        return writes.next()


def _new_machine(
    machine_id: UUID,
    machine_type: str,
    version: int,
    definition: MachineDefinition,
    context: dict[str, Any],
    agent: UUID | None,
    issue: int | None,
    now: datetime,
) -> NewMachine:
    """The row of a machine just started: running, its initial state due to be entered now."""
    budget = definition.budget
    return NewMachine(
        id=machine_id,
        type=machine_type,
        agent_type=definition.agent_type_of(definition.state(definition.initial_state)),
        current_state=definition.initial_state,
        context=initial_context(definition, context),
        status=MachineStatus.RUNNING.value,
        github_issue=issue,
        created_at=now,
        updated_at=now,
        definition_version=version,
        agent_id=agent,
        agent_pinned=agent is not None,
        budget_tokens=budget.tokens if budget else None,
        budget_cost=budget.cost if budget else None,
        attempt=1,
        state_retries=0,
        dispatch_due_at=now,
    )


def _found_txn(conn: Connection, asked: KeyedStart) -> Started | None:
    """The machine of the start that holds the key, if one does and asked the same; refused
    (StartKeyReused) when it asked otherwise; None when no start holds the key."""
    held = keys.held_txn(conn, asked.key)
    if held is None:
        return None
    first, machine_id = held
    differs = differences(first, asked)
    if differs:
        raise StartKeyReused(asked.key, str(machine_id), first.machine_type, differs)
    return Started(machine_id, None)


def _cancel_reason(command: Command) -> str:
    """What an agent is told of the command that took its attempt away."""
    why = f"{command.action.value} by {command.actor}"
    return f"{why}: {command.reason}" if command.reason else why


def checked_context(context: Mapping[str, Any] | None, max_bytes: int) -> dict[str, Any]:
    if context is None:
        return {}
    if not isinstance(context, Mapping):
        raise InvalidContext(f"context must be a JSON object, got {type(context).__name__}")
    try:
        text = json.dumps(dict(context), allow_nan=False)
        checked = dict(json.loads(text))
    except (TypeError, ValueError, RecursionError) as exc:
        raise InvalidContext(f"context is not storable JSON: {exc}") from exc
    if len(text.encode()) > max_bytes:
        raise InvalidContext(
            f"context is {len(text.encode())} bytes, over the limit of {max_bytes}"
        )
    problem = unstorable(checked, "context")
    if problem is not None:
        raise InvalidContext(problem)
    for counter in (LOOP_COUNT, LOOP_LIMIT):
        value = checked.get(counter, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidContext(f"context {counter} must be a whole number >= 0, got {value!r}")
    return checked


def _check_schema(definition: MachineDefinition, context: dict[str, Any]) -> None:
    """Refuse a context the definition's context_schema does not accept (before any write)."""
    if definition.context_schema is not None:
        mismatch = context_problem(definition.context_schema, context)
        if mismatch is not None:
            raise ContextMismatch(definition.type, mismatch)


def _agent_uuid(agent_id: UUID | str | None) -> UUID | None:
    if agent_id is None or isinstance(agent_id, UUID):
        return agent_id
    try:
        return UUID(str(agent_id))
    except ValueError:
        raise InvalidAgentId(agent_id) from None


def _fits_int32(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT32_MAX


def _lock_one(conn: Connection, machine_id: UUID) -> tuple[Rows, q.AnyRow]:
    """The machine's row locked (with its ancestors'), or MachineNotFound."""
    rows = q.lock_machines_txn(conn, [machine_id])
    row = rows.get(machine_id)
    if row is None:
        raise MachineNotFound(str(machine_id))
    return rows, row
