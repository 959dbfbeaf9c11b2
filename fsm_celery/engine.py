"""Load → decide → store → dispatch. The engine moves data around the pure core; no Celery here."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from functools import lru_cache
from typing import Any
from uuid import UUID

import jinja2
from pydantic import ValidationError
from sqlalchemy import Connection, Engine

from fsm_celery.changes import Changes, Step, aware, snapshot
from fsm_celery.channel import Dispatcher
from fsm_celery.config import Settings
from fsm_celery.core.admin import Action, Command, decide_command
from fsm_celery.core.definition import TEMPLATES, FailureKind, MachineDefinition
from fsm_celery.core.messages import (
    AgentStatus,
    MachineMessage,
    StateAck,
    StateHeartbeat,
    StateTask,
    holds_nul,
    parse_agent_message,
    task_token,
    token_matches,
)
from fsm_celery.core.transition import (
    LOOP_COUNT,
    LOOP_LIMIT,
    Ack,
    Machine,
    MachineStatus,
    Rejected,
    RejectReason,
    Timeout,
    check_event,
    decide,
    initial_context,
)
from fsm_celery.core.usage import BUDGET_EXCEEDED, Budget
from fsm_celery.exceptions import (
    CommandRefused,
    InvalidAgentId,
    InvalidContext,
    MachineNotFound,
    UnknownMachineType,
)
from fsm_celery.store import queries as q

log = logging.getLogger(__name__)

__all__ = ["MachineEngine", "Step"]


EARLY = timedelta(milliseconds=50)  # how early a countdown may fire and still enter a state


def utcnow() -> datetime:
    return datetime.now(UTC)


class MachineEngine:
    """Runs machines: starts them, enters states, applies acks, timeouts and commands, scans."""

    def __init__(
        self,
        db: Engine,
        dispatcher: Dispatcher,
        settings: Settings,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.db = db
        self.dispatcher = dispatcher
        self.settings = settings
        self.clock = clock
        self._definitions: dict[tuple[str, int], MachineDefinition] = {}

    # definitions ------------------------------------------------------------------------

    def load_definitions(
        self, definitions: Iterable[MachineDefinition]
    ) -> list[tuple[str, int, bool]]:
        """Store each definition as a new version when it changed: (type, version, created)."""
        with self.db.begin() as conn:
            return [(d.type, *q.save_definition_txn(conn, d)) for d in definitions]

    def _definition(self, conn: Connection, machine_type: str, version: int) -> MachineDefinition:
        key = (machine_type, version)
        found = self._definitions.get(key)
        if found is None:
            found = q.definition_txn(conn, machine_type, version)
            self._definitions[key] = found
        return found

    # start ------------------------------------------------------------------------------

    def start(
        self,
        machine_type: str,
        context: Mapping[str, Any] | None = None,
        agent_id: UUID | str | None = None,
        github_issue: int | None = None,
    ) -> Step:
        """Create a running machine in its initial state; the step must then be entered."""
        context = _checked_context(context)
        agent = _agent_uuid(agent_id)
        now = self.clock()
        machine_id = uuid.uuid4()
        with self.db.begin() as conn:
            latest = q.latest_definition_txn(conn, machine_type)
            if latest is None:
                raise UnknownMachineType(machine_type)
            version, definition = latest
            self._definitions.setdefault((machine_type, version), definition)
            issue = github_issue if github_issue is not None else context.get("githubIssue")
            q.insert_machine_txn(
                conn,
                {
                    "id": machine_id,
                    "type": machine_type,
                    "agent_type": definition.agent_type,
                    "current_state": definition.initial_state,
                    "context": initial_context(definition, context),
                    "status": MachineStatus.RUNNING.value,
                    "github_issue": issue if isinstance(issue, int) else None,
                    "created_at": now,
                    "updated_at": now,
                    "definition_version": version,
                    "agent_id": agent,
                    "agent_pinned": agent is not None,
                    "budget_tokens": definition.budget.tokens if definition.budget else None,
                    "budget_cost": definition.budget.cost if definition.budget else None,
                    "attempt": 1,
                    "state_retries": 0,
                    "dispatch_due_at": now,
                },
            )
            start_row = {
                "machine_id": machine_id,
                "from_state": None,
                "to_state": definition.initial_state,
                "success": True,
                "attempt": 0,
                "event": "start",
                "created_at": now,
            }
            q.insert_transitions_txn(conn, [start_row])
        return Step(machine_id, 1)

    # enter a state ----------------------------------------------------------------------

    def enter_state(self, machine_id: UUID, attempt: int) -> bool:
        """Dispatch the attempt's state_task unless that was done already; whether it was."""
        changes = Changes(self.clock())
        with self.db.begin() as conn:
            row = q.lock_machines_txn(conn, [machine_id]).get(machine_id)
            if row is None or not _awaits_dispatch(row, attempt):
                return False
            if aware(row.dispatch_due_at) > changes.now + EARLY:  # type: ignore[operator]
                return False  # a retry delay is still running: the scan enters it when due
            self._enter(conn, row, snapshot(row), changes)
            self._finish(conn, changes)
        return True

    def _enter(self, conn: Connection, row: q.AnyRow, machine: Machine, changes: Changes) -> None:
        """Build the attempt's state_task, route it, and record it as sent (in this txn)."""
        definition = self._definition(conn, row.type, row.definition_version)
        state = definition.state(machine.current_state)
        deadline = changes.now + state.timeout
        task = StateTask(
            machine_id=row.id,
            machine_type=row.type,
            state=state.name,
            attempt=machine.attempt,
            context=dict(machine.context),
            prompt=_render(state.prompt, machine.context),
            required_output=list(state.required_output),
            timeout=int(state.timeout_seconds * 1000),
            deadline=deadline,
            task_token=task_token(
                self.settings.task_token_secret, row.id, state.name, machine.attempt
            ),
            heartbeat_timeout=_ms(state.heartbeat_timeout),
        )
        changes.dispatch(row.id, self._route(conn, row, changes.now), task.to_wire(), deadline)

    def _finish(self, conn: Connection, changes: Changes) -> None:
        """Send the transaction's state_tasks, then write its changes; the caller commits.

        The rows are locked and the decision is made, so the tasks go out at once: the write
        and the commit (a few milliseconds under load) are not part of an agent's wait. A
        failure or a crash before the commit rolls the decision back and the message that caused
        it is delivered again, so a state_task may be sent twice (at least once); its duplicate
        ack is then refused as stale, and the work is applied once. What the database is known
        to refuse (a NUL character) is rejected before the batch, so it does not cause this.
        """
        self.dispatcher.dispatch_many(changes.outbox)
        changes.write(conn)

    def _route(self, conn: Connection, row: q.AnyRow, now: datetime) -> str:
        """Where the task goes: the machine's agent, else a live agent of its type, else the
        type's own channel and stream, where any agent of the type may take it."""
        since = now - timedelta(seconds=self.settings.agent_liveness_seconds)
        if row.agent_id is not None and (
            row.agent_pinned or q.agent_alive_txn(conn, row.agent_id, since)
        ):
            return str(row.agent_id)
        chosen = q.pick_agent_txn(conn, row.agent_type, since, now)
        if chosen is None:
            return str(row.agent_type)
        q.assign_agent_txn(conn, row.id, chosen)
        return str(chosen)

    # acks and heartbeats ----------------------------------------------------------------

    def apply_messages(self, payloads: Iterable[str]) -> list[Step]:
        """Apply a batch of raw agent messages in one transaction; the steps to enter."""
        changes = Changes(self.clock())
        parsed: list[tuple[MachineMessage, str]] = []
        statuses: dict[UUID, AgentStatus] = {}
        for raw in payloads:
            message = self._parse(raw, changes)
            if isinstance(message, AgentStatus):
                statuses[message.agent_id] = message  # the latest of each agent's reports
            elif message is not None:
                parsed.append((message, raw))
        with self.db.begin() as conn:
            q.upsert_agents_txn(conn, [_agent_row(s, changes.now) for s in statuses.values()])
            rows = q.lock_machines_txn(conn, (m.machine_id for m, _ in parsed))
            for message, raw in parsed:
                row = rows.get(message.machine_id)
                if row is None:
                    detail = f"no machine {message.machine_id}"
                    changes.reject(RejectReason.UNKNOWN_MACHINE, detail, raw, **_where(message))
                else:
                    self._apply(conn, row, message, raw, changes)
            for mid in changes.due_now():
                self._enter(conn, rows[mid], changes.snapshots[mid], changes)
            self._finish(conn, changes)
        return changes.steps()

    def reject(self, raw: str, reason: RejectReason, detail: str) -> None:
        """Record a message as rejected, in a transaction of its own."""
        changes = Changes(self.clock())
        try:
            message = parse_agent_message(raw)
        except ValidationError:
            changes.reject(reason, detail, raw)
        else:
            changes.reject(reason, detail, raw, **_where(message))
        with self.db.begin() as conn:
            changes.write(conn)

    def _parse(self, raw: str, changes: Changes) -> AgentMessage | None:
        limit = self.settings.max_payload_bytes
        if len(raw.encode("utf-8", "replace")) > limit:
            changes.reject(RejectReason.OVERSIZED, f"payload over {limit} bytes", raw)
            return None
        try:
            message = parse_agent_message(raw)
        except ValidationError as exc:
            reason = (
                RejectReason.MALFORMED_JSON
                if any(e["type"] == "json_invalid" for e in exc.errors())
                else RejectReason.SCHEMA_VIOLATION
            )
            changes.reject(reason, _describe(exc), raw)
            return None
        if "\\u0000" in raw and holds_nul(message.model_dump()):
            # Refused here rather than by the database, after this message's batch-mates had
            # been dispatched: the batch would be rolled back and their tasks sent twice.
            changes.reject(RejectReason.UNPROCESSABLE, NUL_DETAIL, raw, **_where(message))
            return None
        return message

    def _apply(
        self,
        conn: Connection,
        row: q.AnyRow,
        message: MachineMessage,
        raw: str,
        changes: Changes,
    ) -> None:
        machine = changes.machine(row)
        where = _where(message)
        attempt = self._attempt_of(message, machine)
        if attempt is None:
            detail = "missing or invalid taskToken for this machine, state and attempt"
            changes.reject(RejectReason.BAD_TOKEN, detail, raw, **where)
            return
        where["attempt"] = attempt
        definition = self._definition(conn, row.type, row.definition_version)
        if isinstance(message, StateHeartbeat):
            rejected = check_event(machine, message.state, attempt)
            if rejected is not None:
                changes.reject(rejected.reason, rejected.detail, raw, **where)
                return
            window = definition.state(machine.current_state).heartbeat_window
            changes.heartbeat(row, changes.now + window, message.progress)
            return
        event = Ack(message.state, attempt, message.success, message.output, message.error)
        decision = decide(definition, machine, event)
        if isinstance(decision, Rejected):
            changes.reject(decision.reason, decision.detail, raw, **where)
            return
        if decision.failure is FailureKind.INVALID_OUTPUT:
            changes.reject(RejectReason.MISSING_OUTPUT, decision.error or "", raw, **where)
        changes.transition(row, decision, "ack")

    def _attempt_of(self, message: MachineMessage, machine: Machine) -> int | None:
        """The attempt the message is for, once its token is checked (None: refuse it)."""
        if message.task_token is None and self.settings.accept_unsigned_acks:
            return machine.attempt if message.attempt is None else message.attempt
        secret = self.settings.task_token_secret
        if message.attempt is None or not token_matches(secret, message, message.attempt):
            return None
        return message.attempt

    # timeouts, commands and the scan -----------------------------------------------------

    def scan(self, limit: int = 500) -> tuple[int, list[Step]]:
        """Time out attempts past their deadline and enter the states whose dispatch is due.

        The database is the truth: this also repairs a dispatch lost with a killed worker, a
        dropped message or a flushed Redis. Rows another transaction holds are skipped. Returns
        how many machines it handled (a full batch: scan again at once) and the retries it
        scheduled after a delay.
        """
        changes = Changes(self.clock())
        with self.db.begin() as conn:
            overdue = q.lock_overdue_txn(conn, changes.now, limit)
            for row in overdue:
                definition = self._definition(conn, row.type, row.definition_version)
                decision = decide(
                    definition, snapshot(row), Timeout(row.current_state, row.attempt)
                )
                assert not isinstance(decision, Rejected)  # the query chose dispatched attempts
                changes.transition(row, decision, "timeout")
            due = q.lock_due_txn(conn, changes.now, limit)
            rows = {row.id: row for row in (*overdue, *due)}
            for mid in changes.due_now():
                self._enter(conn, rows[mid], changes.snapshots[mid], changes)
            for row in due:
                self._enter(conn, row, snapshot(row), changes)
            self._finish(conn, changes)
        return len(overdue) + len(due), [s for s in changes.steps() if s.delay > 0]

    def command(self, machine_id: UUID, command: Command) -> list[Step]:
        """Apply an operator's command; raises CommandRefused when it does not apply."""
        changes = Changes(self.clock())
        with self.db.begin() as conn:
            row = q.lock_machines_txn(conn, [machine_id]).get(machine_id)
            if row is None:
                raise MachineNotFound(str(machine_id))
            definition = self._definition(conn, row.type, row.definition_version)
            last = q.last_transition_txn(conn, machine_id)
            decision = decide_command(
                definition, snapshot(row), command, last.from_state if last else None
            )
            if isinstance(decision, Rejected):
                raise CommandRefused(command.action.value, str(machine_id), decision.detail)
            changes.transition(
                row, decision, command.action.value, actor=command.actor, reason=command.reason
            )
            for mid in changes.due_now():
                self._enter(conn, row, changes.snapshots[mid], changes)
            self._finish(conn, changes)
        return changes.steps()

    def set_budget(self, machine_id: UUID, budget: Budget, actor: str) -> list[Step]:
        """Change the machine's budget; one paused for its budget resumes if now within it."""
        with self.db.begin() as conn:
            row = q.lock_machines_txn(conn, [machine_id]).get(machine_id)
            if row is None:
                raise MachineNotFound(str(machine_id))
            q.set_budget_txn(conn, machine_id, budget.tokens, budget.cost)
            machine = replace(snapshot(row), budget=budget)
            paused_for_budget = (row.error or "").startswith(BUDGET_EXCEEDED)
            if machine.status is not MachineStatus.PAUSED or not paused_for_budget:
                return []
            if budget.exceeded_by(machine.usage) is not None:
                return []
            reason = f"budget raised to tokens={budget.tokens}, cost={budget.cost}"
            command = Command(Action.RESUME, actor, reason)
            decision = decide_command(
                self._definition(conn, row.type, row.definition_version), machine, command
            )
            assert not isinstance(decision, Rejected)  # a paused machine can always resume
            changes = Changes(self.clock())
            changes.transition(row, decision, "resume", actor=actor, reason=reason)
            self._enter(conn, row, changes.snapshots[row.id], changes)
            self._finish(conn, changes)
        return changes.steps()


AgentMessage = StateAck | StateHeartbeat | AgentStatus


NUL_DETAIL = "the message holds a NUL character (\\u0000), which PostgreSQL cannot store"


def _where(message: AgentMessage) -> dict[str, Any]:
    """Which machine, state and attempt a rejected message was about (none for a status)."""
    if isinstance(message, AgentStatus):
        return {}
    return {"machine_id": message.machine_id, "state": message.state, "attempt": message.attempt}


def _agent_row(status: AgentStatus, now: datetime) -> dict[str, Any]:
    return {
        "id": status.agent_id,
        "agent_type": status.agent_type,
        "status": status.status,
        "concurrency": status.concurrency,
        "running": status.running,
        "hostname": status.hostname,
        "started_at": now,
        "last_seen_at": now,
    }


def _awaits_dispatch(row: q.AnyRow | None, attempt: int) -> bool:
    return (
        row is not None
        and row.status == MachineStatus.RUNNING
        and row.attempt == attempt
        and row.dispatch_due_at is not None
    )


def _checked_context(context: Mapping[str, Any] | None) -> dict[str, Any]:
    if context is None:
        return {}
    if not isinstance(context, Mapping):
        raise InvalidContext(f"context must be a JSON object, got {type(context).__name__}")
    try:
        checked = dict(json.loads(json.dumps(dict(context))))
    except (TypeError, ValueError) as exc:
        raise InvalidContext(f"context is not JSON-serialisable: {exc}") from exc
    for counter in (LOOP_COUNT, LOOP_LIMIT):
        value = checked.get(counter, 0)
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise InvalidContext(f"context {counter} must be a whole number >= 0, got {value!r}")
    return checked


def _agent_uuid(agent_id: UUID | str | None) -> UUID | None:
    if agent_id is None or isinstance(agent_id, UUID):
        return agent_id
    try:
        return UUID(str(agent_id))
    except ValueError:
        raise InvalidAgentId(agent_id) from None


def _ms(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds() * 1000)


@lru_cache(maxsize=4096)
def _template(source: str) -> jinja2.Template:
    return TEMPLATES.from_string(source)  # compiling costs far more than rendering


def _render(template: str, context: Mapping[str, Any]) -> str:
    if "{" not in template and not template.endswith("\n"):
        return template  # Jinja would give it back as it is (it drops one trailing newline)
    try:
        return _template(template).render(**context)
    except jinja2.TemplateError as exc:
        log.warning("prompt template failed to render (%s); sending it unrendered", exc)
        return template


def _describe(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}" for e in exc.errors()
    )
