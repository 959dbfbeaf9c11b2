"""Load → decide → store → dispatch. The engine moves data around the pure core; no Celery here."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime, timedelta
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
    parse_agent_message,
    task_token,
    token_matches,
)
from fsm_celery.core.transition import (
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

__all__ = ["MachineEngine", "Step", "TimeoutCheck"]


def utcnow() -> datetime:
    return datetime.now(UTC)


@dataclass(frozen=True)
class TimeoutCheck:
    """What a timeout check found: a step to enter, or how long until the deadline."""

    steps: list[Step] = field(default_factory=list)
    wait_seconds: float | None = None


class MachineEngine:
    """Runs machines: starts them, enters states, applies acks, timeouts and commands, sweeps."""

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

    def enter_state(self, machine_id: UUID, attempt: int) -> float | None:
        """Dispatch the attempt's state_task; the seconds to its deadline, or None if no-op."""
        now = self.clock()
        with self.db.begin() as conn:
            row = q.lock_machines_txn(conn, [machine_id]).get(machine_id)
            if not _awaits_dispatch(row, attempt):
                return None
            assert row is not None
            definition = self._definition(conn, row.type, row.definition_version)
            state = definition.state(row.current_state)
            deadline = now + state.timeout
            task = StateTask(
                machine_id=row.id,
                machine_type=row.type,
                state=state.name,
                attempt=attempt,
                context=row.context,
                prompt=_render(state.prompt, row.context),
                required_output=list(state.required_output),
                timeout=int(state.timeout_seconds * 1000),
                deadline=deadline,
                task_token=task_token(self.settings.task_token_secret, row.id, state.name, attempt),
                heartbeat_timeout=_ms(state.heartbeat_timeout),
            )
            q.mark_dispatched_txn(conn, row.id, now, deadline)
            agent = self._route(conn, row, now)
            # Sent before commit: a crash after it sends again (at-least-once dispatch);
            # the duplicate ack is rejected as stale, so the work is applied once.
            self.dispatcher.dispatch(agent, task.to_wire())
        return state.timeout_seconds

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
                    changes.reject(
                        RejectReason.UNKNOWN_MACHINE,
                        f"no machine {message.machine_id}",
                        raw,
                        machine_id=message.machine_id,
                        state=message.state,
                        attempt=message.attempt,
                    )
                else:
                    self._apply(conn, row, message, raw, changes)
            changes.write(conn)
        return changes.steps()

    def _parse(self, raw: str, changes: Changes) -> AgentMessage | None:
        limit = self.settings.max_payload_bytes
        if len(raw.encode("utf-8", "replace")) > limit:
            changes.reject(RejectReason.OVERSIZED, f"payload over {limit} bytes", raw)
            return None
        try:
            return parse_agent_message(raw)
        except ValidationError as exc:
            reason = (
                RejectReason.MALFORMED_JSON
                if any(e["type"] == "json_invalid" for e in exc.errors())
                else RejectReason.SCHEMA_VIOLATION
            )
            changes.reject(reason, _describe(exc), raw)
            return None

    def _apply(
        self,
        conn: Connection,
        row: q.AnyRow,
        message: MachineMessage,
        raw: str,
        changes: Changes,
    ) -> None:
        machine = changes.machine(row)
        where = {"machine_id": row.id, "state": message.state, "attempt": message.attempt}
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

    # timeouts, commands and the sweeper -------------------------------------------------

    def check_timeout(self, machine_id: UUID, attempt: int) -> TimeoutCheck:
        """Time the attempt out if its deadline passed; otherwise say how long is left."""
        changes = Changes(self.clock())
        with self.db.begin() as conn:
            row = q.lock_machines_txn(conn, [machine_id]).get(machine_id)
            if row is None or not _dispatched(row, attempt):
                return TimeoutCheck()
            left = (aware(row.deadline_at) - changes.now).total_seconds()  # type: ignore[operator]
            if left > 0:
                return TimeoutCheck(wait_seconds=left)
            definition = self._definition(conn, row.type, row.definition_version)
            decision = decide(definition, snapshot(row), Timeout(row.current_state, attempt))
            assert not isinstance(decision, Rejected)  # _dispatched checked what decide checks
            changes.transition(row, decision, "timeout")
            changes.write(conn)
        return TimeoutCheck(steps=changes.steps())

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
            changes.write(conn)
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
            changes.write(conn)
        return changes.steps()

    def sweep(self, limit: int = 1000) -> tuple[list[Step], list[Step]]:
        """Machines to repair: (due but never dispatched, deadline passed but not timed out)."""
        before = self.clock() - timedelta(seconds=self.settings.sweep_grace_seconds)
        with self.db.connect() as conn:
            due = [Step(r.id, r.attempt) for r in q.due_dispatches_txn(conn, before, limit)]
            overdue = [Step(r.id, r.attempt) for r in q.overdue_deadlines_txn(conn, before, limit)]
        return due, overdue


AgentMessage = StateAck | StateHeartbeat | AgentStatus


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


def _dispatched(row: q.AnyRow, attempt: int) -> bool:
    return (
        row.status == MachineStatus.RUNNING
        and row.attempt == attempt
        and row.dispatch_due_at is None
        and row.deadline_at is not None
    )


def _checked_context(context: Mapping[str, Any] | None) -> dict[str, Any]:
    if context is None:
        return {}
    if not isinstance(context, Mapping):
        raise InvalidContext(f"context must be a JSON object, got {type(context).__name__}")
    try:
        return dict(json.loads(json.dumps(dict(context))))
    except (TypeError, ValueError) as exc:
        raise InvalidContext(f"context is not JSON-serialisable: {exc}") from exc


def _agent_uuid(agent_id: UUID | str | None) -> UUID | None:
    if agent_id is None or isinstance(agent_id, UUID):
        return agent_id
    try:
        return UUID(str(agent_id))
    except ValueError:
        raise InvalidAgentId(agent_id) from None


def _ms(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds() * 1000)


def _render(template: str, context: Mapping[str, Any]) -> str:
    try:
        return TEMPLATES.from_string(template).render(**context)
    except jinja2.TemplateError as exc:
        log.warning("prompt template failed to render (%s); sending it unrendered", exc)
        return template


def _describe(exc: ValidationError) -> str:
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}" for e in exc.errors()
    )
