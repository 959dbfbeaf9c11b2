"""What one transaction decided: machine updates, heartbeats, history rows and rejections."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core.messages import INT32_MAX
from fsm_celery.core.transition import Machine, MachineStatus, RejectReason, Transition
from fsm_celery.core.usage import Budget, Usage
from fsm_celery.store import queries as q

KEEPS_ERROR = (MachineStatus.FAILED, MachineStatus.PAUSED)  # why it failed, or why it paused


class Step(NamedTuple):
    """A machine, the attempt whose state must be entered next, and how long to wait first
    (its type and the state name travel along for people: Flower shows them)."""

    machine_id: UUID
    attempt: int
    delay: float = 0.0
    state: str = ""
    machine_type: str = ""


def aware(value: datetime | None) -> datetime | None:
    """The datetime with UTC attached (SQLite hands back naive datetimes; all stored are UTC)."""
    if value is not None and value.tzinfo is None:
        return value.replace(tzinfo=UTC)
    return value


def snapshot(row: q.AnyRow) -> Machine:
    """The core's view of a machine row."""
    return Machine(
        id=row.id,
        current_state=row.current_state,
        status=MachineStatus(row.status),
        attempt=row.attempt,
        state_retries=row.state_retries,
        context=row.context,
        usage=Usage(row.tokens_used, row.cost),
        budget=Budget(tokens=row.budget_tokens, cost=row.budget_cost),
        handbacks=row.handbacks,
    )


@dataclass
class Changes:
    """Collects the writes of one transaction, then writes them in one go."""

    now: datetime
    updates: dict[UUID, dict[str, Any]] = field(default_factory=dict)
    beats: dict[UUID, dict[str, Any]] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    rejections: list[dict[str, Any]] = field(default_factory=list)
    snapshots: dict[UUID, Machine] = field(default_factory=dict)
    delays: dict[UUID, float] = field(default_factory=dict)
    types: dict[UUID, str] = field(default_factory=dict)
    dispatched: dict[UUID, dict[str, Any]] = field(default_factory=dict)
    outbox: list[tuple[str, str]] = field(default_factory=list)

    def machine(self, row: q.AnyRow) -> Machine:
        """The machine as this transaction has left it so far."""
        return self.snapshots.get(row.id) or snapshot(row)

    def transition(
        self,
        row: q.AnyRow,
        t: Transition,
        event: str,
        *,
        actor: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Record a decided transition: the machine's new state and the attempt's history row."""
        machine = self.machine(row)
        running = t.status is MachineStatus.RUNNING
        due = self.now + timedelta(seconds=t.delay_seconds) if running else None
        spent = machine.usage + t.usage
        self.snapshots[row.id] = Machine(
            id=row.id,
            current_state=t.to_state,
            status=t.status,
            attempt=t.attempt,
            state_retries=t.state_retries,
            context=t.context,
            usage=spent,
            budget=machine.budget,
            handbacks=t.handbacks,
        )
        self.delays[row.id] = t.delay_seconds
        self.types[row.id] = row.type
        self.updates[row.id] = {
            "_id": row.id,
            "current_state": t.to_state,
            "status": t.status.value,
            "context": t.context,
            "attempt": t.attempt,
            "state_retries": t.state_retries,
            "handbacks": t.handbacks,
            "dispatch_due_at": due,
            "deadline_at": None,
            "heartbeat_at": None,
            "progress": None,
            "tokens_used": spent.tokens,
            "cost": spent.cost,
            "entered_at": row.entered_at,
            "error": t.error if t.status in KEEPS_ERROR else None,
            "updated_at": self.now,
        }
        beat = self.beats.get(row.id, {})
        entered = aware(row.entered_at)
        self.history.append(
            {
                "machine_id": row.id,
                "from_state": t.from_state,
                "to_state": t.to_state,
                "success": t.success,
                "output": t.output,
                "error_message": t.error,
                "duration_ms": _ms(self.now - entered) if entered and event != "resume" else None,
                "attempt": machine.attempt,
                "event": event,
                "actor": actor,
                "reason": reason,
                "progress": beat.get("progress", row.progress),
                "agent_id": row.agent_id,
                "tokens_used": t.usage.tokens,
                "cost": t.usage.cost,
                "created_at": self.now,
            }
        )

    def dispatch(self, machine_id: UUID, agent: str, message: str, deadline: datetime) -> None:
        """Record that the machine's attempt is sent now, with its deadline, and queue it."""
        entered = {
            "dispatch_due_at": None,
            "entered_at": self.now,
            "deadline_at": deadline,
            "updated_at": self.now,
        }
        if machine_id in self.updates:  # decided in this transaction: one UPDATE does both
            self.updates[machine_id].update(entered)
        else:
            self.dispatched[machine_id] = {"_id": machine_id, **entered}
        self.outbox.append((agent, message))

    def due_now(self) -> list[UUID]:
        """Machines this transaction moved on whose next state is to be entered at once."""
        return [
            mid
            for mid, u in self.updates.items()
            if u["status"] == MachineStatus.RUNNING.value and not self.delays.get(mid)
        ]

    def heartbeat(self, row: q.AnyRow, deadline: datetime, progress: str | None) -> None:
        """Record a sign of life: a later deadline, and the agent's progress text."""
        previous = self.beats.get(row.id, {}).get("progress", row.progress)
        self.beats[row.id] = {
            "_id": row.id,
            "deadline_at": deadline,
            "heartbeat_at": self.now,
            "progress": progress if progress is not None else previous,
        }

    def reject(
        self,
        reason: RejectReason,
        detail: str,
        payload: str,
        *,
        machine_id: UUID | None = None,
        state: str | None = None,
        attempt: int | None = None,
    ) -> None:
        """Record a message that changed nothing, with the reason (what its columns cannot hold
        is cut or left out: recording a rejection must not be able to fail)."""
        self.rejections.append(
            {
                "reason": reason.value,
                "detail": detail,
                "payload": payload,
                "received_at": self.now,
                "machine_id": machine_id,
                "state": state[:50] if state is not None else None,
                "attempt": attempt if attempt is not None and 0 <= attempt <= INT32_MAX else None,
            }
        )

    def steps(self) -> list[Step]:
        """The machines this transaction moved on to a state, and the delay before it."""
        return [
            Step(mid, u["attempt"], self.delays.get(mid, 0.0), u["current_state"], self.types[mid])
            for mid, u in self.updates.items()
            if u["status"] == MachineStatus.RUNNING.value
        ]

    def write(self, conn: Connection) -> None:
        """Write everything decided (the outbox is sent by the caller, before commit)."""
        q.update_heartbeats_txn(conn, list(self.beats.values()))
        q.move_machines_txn(conn, list(self.updates.values()), self.history)
        q.mark_dispatched_txn(conn, list(self.dispatched.values()))
        q.insert_rejections_txn(conn, self.rejections)


def _ms(delta: timedelta) -> int:
    return int(delta.total_seconds() * 1000)
