"""Load → decide → store → dispatch. The engine moves data around the pure core; no Celery here."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from uuid import UUID

import jinja2
from pydantic import ValidationError
from sqlalchemy import Connection, Engine

from fsm_celery.channel import Publisher
from fsm_celery.config import Settings
from fsm_celery.core.definition import TEMPLATES, MachineDefinition
from fsm_celery.core.messages import StateAck, StateTask, task_channel, task_token, token_matches
from fsm_celery.core.transition import (
    Ack,
    Event,
    Machine,
    MachineStatus,
    Rejected,
    RejectReason,
    Timeout,
    Transition,
    decide,
    initial_context,
)
from fsm_celery.exceptions import InvalidAgentId, InvalidContext, UnknownMachineType
from fsm_celery.store import queries as q

log = logging.getLogger(__name__)

Step = tuple[UUID, int]
"""A machine and the attempt whose state must be entered next."""


def utcnow() -> datetime:
    return datetime.now(UTC)


def _aware(value: datetime | None) -> datetime | None:
    # SQLite hands back naive datetimes; everything stored is UTC.
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


@dataclass
class _Batch:
    """What one transaction decided: machine updates, history rows, rejections, next steps."""

    updates: dict[UUID, dict[str, Any]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    rejections: list[dict[str, Any]] = field(default_factory=list)
    snapshots: dict[UUID, Machine] = field(default_factory=dict)

    def steps(self) -> list[Step]:
        return [
            (mid, u["attempt"])
            for mid, u in self.updates.items()
            if u["status"] == MachineStatus.RUNNING
        ]

    def write(self, conn: Connection) -> None:
        q.update_machines_txn(conn, list(self.updates.values()))
        q.insert_transitions_txn(conn, self.history)
        q.insert_rejections_txn(conn, self.rejections)


@dataclass(frozen=True)
class TimeoutCheck:
    """What a timeout check found: a step to enter, or how long until the deadline."""

    steps: list[Step] = field(default_factory=list)
    wait_seconds: float | None = None


class MachineEngine:
    """Runs machines: starts them, enters states, applies acks and timeouts, sweeps."""

    def __init__(
        self,
        db: Engine,
        publisher: Publisher,
        settings: Settings,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.db = db
        self.publisher = publisher
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
                    "status": "running",
                    "github_issue": issue if isinstance(issue, int) else None,
                    "created_at": now,
                    "updated_at": now,
                    "definition_version": version,
                    "agent_id": agent,
                    "attempt": 1,
                    "state_retries": 0,
                    "dispatch_due_at": now,
                },
            )
            q.insert_transitions_txn(
                conn,
                [
                    {
                        "machine_id": machine_id,
                        "from_state": None,
                        "to_state": definition.initial_state,
                        "success": True,
                        "output": None,
                        "attempt": 0,
                        "event": "start",
                        "created_at": now,
                    }
                ],
            )
        return machine_id, 1

    # enter a state ----------------------------------------------------------------------

    def enter_state(self, machine_id: UUID, attempt: int) -> float | None:
        """Dispatch the attempt's state_task; the seconds to its deadline, or None if no-op."""
        now = self.clock()
        with self.db.begin() as conn:
            row = q.lock_machines_txn(conn, [machine_id]).get(machine_id)
            if (
                row is None
                or row.status != MachineStatus.RUNNING
                or row.attempt != attempt
                or row.dispatch_due_at is None
            ):
                return None
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
            )
            agent = str(row.agent_id) if row.agent_id is not None else row.agent_type
            q.mark_dispatched_txn(conn, row.id, now, deadline)
            # Published before commit: a crash after it re-sends (at-least-once dispatch);
            # duplicate acks are rejected, so the agent's work is applied once.
            self.publisher.publish(
                task_channel(agent, self.settings.channel_prefix), task.to_wire()
            )
        return state.timeout_seconds

    # acks -------------------------------------------------------------------------------

    def apply_acks(self, payloads: Iterable[str]) -> list[Step]:
        """Apply a batch of raw acks in one transaction; the steps to enter after commit."""
        now = self.clock()
        batch = _Batch()
        acks: list[tuple[StateAck, str]] = []
        for raw in payloads:
            parsed = self._parse(raw, batch, now)
            if parsed is not None:
                acks.append((parsed, raw))
        with self.db.begin() as conn:
            rows = q.lock_machines_txn(conn, (ack.machine_id for ack, _ in acks))
            for ack, raw in acks:
                self._apply_ack(conn, rows.get(ack.machine_id), ack, raw, batch, now)
            batch.write(conn)
        return batch.steps()

    def _parse(self, raw: str, batch: _Batch, now: datetime) -> StateAck | None:
        if len(raw.encode("utf-8", "replace")) > self.settings.max_payload_bytes:
            batch.rejections.append(
                _rejection(
                    RejectReason.OVERSIZED,
                    f"payload over {self.settings.max_payload_bytes} bytes",
                    raw,
                    now,
                )
            )
            return None
        try:
            return StateAck.model_validate_json(raw)
        except ValidationError as exc:
            reason = (
                RejectReason.MALFORMED_JSON
                if _is_json_error(exc)
                else RejectReason.SCHEMA_VIOLATION
            )
            detail = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}"
                for e in exc.errors()
            )
            batch.rejections.append(_rejection(reason, detail, raw, now))
            return None

    def _apply_ack(
        self,
        conn: Connection,
        row: q.AnyRow | None,
        ack: StateAck,
        raw: str,
        batch: _Batch,
        now: datetime,
    ) -> None:
        if row is None:
            batch.rejections.append(
                _rejection(
                    RejectReason.UNKNOWN_MACHINE, f"no machine {ack.machine_id}", raw, now, ack
                )
            )
            return
        machine = batch.snapshots.get(row.id) or _snapshot(row)
        attempt = ack.attempt
        if ack.task_token is None and self.settings.accept_unsigned_acks:
            attempt = machine.attempt if attempt is None else attempt
        elif attempt is None or not token_matches(self.settings.task_token_secret, ack, attempt):
            batch.rejections.append(
                _rejection(
                    RejectReason.BAD_TOKEN,
                    "missing or invalid taskToken for this machine, state and attempt",
                    raw,
                    now,
                    ack,
                )
            )
            return
        event = Ack(
            state=ack.state,
            attempt=attempt,
            success=ack.success,
            output=ack.output,
            error=ack.error,
        )
        self._decide(conn, row, machine, event, batch, now, raw)

    def _decide(
        self,
        conn: Connection,
        row: q.AnyRow,
        machine: Machine,
        event: Event,
        batch: _Batch,
        now: datetime,
        raw: str | None = None,
    ) -> None:
        definition = self._definition(conn, row.type, row.definition_version)
        decision = decide(definition, machine, event)
        if isinstance(decision, Rejected):
            if raw is not None:
                batch.rejections.append(
                    _rejection(decision.reason, decision.detail, raw, now, None, row.id, event)
                )
            return
        batch.snapshots[row.id] = _after(machine, decision)
        batch.updates[row.id] = _update(row.id, decision, now)
        entered = _aware(row.entered_at)
        batch.history.append(
            {
                "machine_id": row.id,
                "from_state": decision.from_state,
                "to_state": decision.to_state,
                "success": decision.success,
                "output": decision.output,
                "error_message": decision.error,
                "duration_ms": int((now - entered).total_seconds() * 1000) if entered else None,
                "attempt": event.attempt,
                "event": "timeout" if isinstance(event, Timeout) else "ack",
                "created_at": now,
            }
        )

    # timeouts and the sweeper -----------------------------------------------------------

    def check_timeout(self, machine_id: UUID, attempt: int) -> TimeoutCheck:
        """Time the attempt out if its deadline passed; otherwise say how long is left."""
        now = self.clock()
        batch = _Batch()
        with self.db.begin() as conn:
            row = q.lock_machines_txn(conn, [machine_id]).get(machine_id)
            if (
                row is None
                or row.status != MachineStatus.RUNNING
                or row.attempt != attempt
                or row.dispatch_due_at is not None
                or row.deadline_at is None
            ):
                return TimeoutCheck()
            left = (_aware(row.deadline_at) - now).total_seconds()  # type: ignore[operator]
            if left > 0:
                return TimeoutCheck(wait_seconds=left)
            self._decide(conn, row, _snapshot(row), Timeout(row.current_state, attempt), batch, now)
            batch.write(conn)
        return TimeoutCheck(steps=batch.steps())

    def sweep(self, limit: int = 1000) -> tuple[list[Step], list[Step]]:
        """Machines to repair: (never dispatched after commit, deadline passed unapplied)."""
        before = self.clock() - timedelta(seconds=self.settings.sweep_grace_seconds)
        with self.db.connect() as conn:
            dispatch = [(r.id, r.attempt) for r in q.due_dispatches_txn(conn, before, limit)]
            overdue = [(r.id, r.attempt) for r in q.overdue_deadlines_txn(conn, before, limit)]
        return dispatch, overdue


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


def _render(template: str, context: Mapping[str, Any]) -> str:
    try:
        return TEMPLATES.from_string(template).render(**context)
    except jinja2.TemplateError as exc:
        log.warning("prompt template failed to render (%s); sending it unrendered", exc)
        return template


def _snapshot(row: q.AnyRow) -> Machine:
    return Machine(
        id=row.id,
        current_state=row.current_state,
        status=MachineStatus(row.status),
        attempt=row.attempt,
        state_retries=row.state_retries,
        context=row.context,
    )


def _after(machine: Machine, t: Transition) -> Machine:
    return Machine(
        id=machine.id,
        current_state=t.to_state,
        status=t.status,
        attempt=t.attempt,
        state_retries=t.state_retries,
        context=t.context,
    )


def _update(machine_id: UUID, t: Transition, now: datetime) -> dict[str, Any]:
    running = t.status is MachineStatus.RUNNING
    return {
        "_id": machine_id,
        "current_state": t.to_state,
        "status": t.status.value,
        "context": t.context,
        "attempt": t.attempt,
        "state_retries": t.state_retries,
        "dispatch_due_at": now if running else None,
        "deadline_at": None,
        "error": None if t.status is not MachineStatus.FAILED else t.error,
        "updated_at": now,
    }


def _rejection(
    reason: RejectReason,
    detail: str,
    raw: str,
    now: datetime,
    ack: StateAck | None = None,
    machine_id: UUID | None = None,
    event: Event | None = None,
) -> dict[str, Any]:
    return {
        "reason": reason.value,
        "detail": detail,
        "payload": raw,
        "received_at": now,
        "machine_id": machine_id or (ack.machine_id if ack else None),
        "state": event.state if event else (ack.state if ack else None),
        "attempt": event.attempt if event else (ack.attempt if ack else None),
    }


def _is_json_error(exc: ValidationError) -> bool:
    return any(e["type"] == "json_invalid" for e in exc.errors())
