"""Load → decide → store → dispatch. The engine moves data around the pure core; no Celery here."""

from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from typing import Any, NamedTuple
from uuid import UUID

import sqlalchemy.exc
from sqlalchemy import Connection, Engine

from fsm_celery.changes import Changes, Step, aware, snapshot
from fsm_celery.channel import Dispatcher
from fsm_celery.config import Settings
from fsm_celery.core import intake
from fsm_celery.core.admin import Action, Command, decide_command
from fsm_celery.core.definition import FailureKind, MachineDefinition, StateDefinition
from fsm_celery.core.intake import Refused
from fsm_celery.core.messages import (
    INT32_MAX,
    AgentStatus,
    AnyAgentMessage,
    MachineMessage,
    StateHandBack,
    StateHeartbeat,
    StateTask,
    task_token,
    unstorable,
)
from fsm_celery.core.prompt import PromptError, render
from fsm_celery.core.transition import (
    LOOP_COUNT,
    LOOP_LIMIT,
    Ack,
    DispatchFailed,
    HandBack,
    Limits,
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

__all__ = ["Inbound", "MachineEngine", "Step"]


class Inbound(NamedTuple):
    """A raw message from Redis, and the agent that sent it when where it came from says so
    (its own ack stream, which only it may write under the Redis ACLs)."""

    raw: str
    agent: UUID | None = None


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
        self.limits = Limits(settings.max_context_bytes, settings.max_handbacks)
        self._longest_attempt = timedelta(seconds=settings.max_attempt_seconds)
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
        context = _checked_context(context, self.settings.max_context_bytes)
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
                    "github_issue": issue if _fits_int32(issue) else None,
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
        return Step(machine_id, 1, 0.0, definition.initial_state, machine_type)

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
        """Build the attempt's state_task, route it, and record it as sent (in this txn).

        A state that cannot be sent (its prompt does not render with this context) fails its
        attempt, recorded, and takes its failure edge; the state that edge leads to is entered
        in turn. The validator bounds every cycle, so this ends.
        """
        definition = self._definition(conn, row.type, row.definition_version)
        for _ in range(definition.step_bound() + 1):
            state = definition.state(machine.current_state)
            try:
                task = self._task(row, state, machine, changes.now)
            except PromptError as exc:
                event = DispatchFailed(state.name, machine.attempt, f"the prompt: {exc}")
                decision = decide(definition, machine, event, self.limits)
                assert not isinstance(decision, Rejected)  # the machine is at that attempt
                changes.transition(row, decision, "dispatch_error")
                if not decision.enters_state:
                    return
                machine = changes.snapshots[row.id]
                continue
            agent = self._route(conn, row, changes.now)
            changes.dispatch(row.id, agent, task.to_wire(), task.deadline)
            return

    def _task(
        self, row: q.AnyRow, state: StateDefinition, machine: Machine, now: datetime
    ) -> StateTask:
        secret = self.settings.token_secrets[0]
        return StateTask(
            machine_id=row.id,
            machine_type=row.type,
            state=state.name,
            attempt=machine.attempt,
            context=dict(machine.context),
            prompt=render(state.prompt, machine.context, self.settings.max_prompt_bytes),
            required_output=list(state.required_output),
            timeout=int(state.timeout_seconds * 1000),
            deadline=now + state.timeout,
            task_token=task_token(secret, row.id, state.name, machine.attempt),
            heartbeat_timeout=_ms(state.heartbeat_timeout),
        )

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

    def apply_messages(self, inbound: Iterable[Inbound], *, enter: bool = True) -> list[Step]:
        """Apply a batch of raw agent messages in one transaction; the steps to enter.

        With enter, the states due now are entered in the same transaction (their state_tasks
        go out before it commits) and the steps returned still to enter are those after a
        retry delay. Without, nothing is sent: every step is returned, for the caller to hand
        to an enter_state task each (the scan enters them if that never happens).
        """
        changes = Changes(self.clock())
        parsed: list[tuple[MachineMessage, Inbound]] = []
        statuses: dict[UUID, tuple[AgentStatus, Inbound]] = {}
        settings = self.settings
        for item in inbound:
            message = self._parse(item.raw, changes)
            if isinstance(message, AgentStatus):
                statuses[message.agent_id] = (message, item)  # each agent's latest report
            elif message is None:
                continue
            elif intake.forged(message, settings.token_secrets, settings.accept_unsigned_acks):
                changes.reject(RejectReason.BAD_TOKEN, BAD_TOKEN, item.raw, **intake.where(message))
            else:
                parsed.append((message, item))
        with self.db.begin() as conn:
            self._record_statuses(conn, statuses.values(), changes)
            rows = q.lock_machines_txn(conn, (m.machine_id for m, _ in parsed))
            senders = _Senders(conn)
            for message, item in parsed:
                row = rows.get(message.machine_id)
                if row is None:
                    detail = f"no machine {message.machine_id}"
                    where = intake.where(message)
                    changes.reject(RejectReason.UNKNOWN_MACHINE, detail, item.raw, **where)
                elif (wrong := senders.wrong_agent(row, item.agent)) is not None:
                    changes.reject(
                        RejectReason.WRONG_AGENT, wrong, item.raw, **intake.where(message)
                    )
                else:
                    self._apply(conn, row, message, item.raw, changes)
            if enter:
                for mid in changes.due_now():
                    self._enter(conn, rows[mid], changes.snapshots[mid], changes)
            self._finish(conn, changes)
        steps = changes.steps()
        return [s for s in steps if s.delay > 0] if enter else steps

    def _record_statuses(
        self,
        conn: Connection,
        statuses: Iterable[tuple[AgentStatus, Inbound]],
        changes: Changes,
    ) -> None:
        """Record each agent's report, unless it came from another agent's stream or claims a
        type other than the one the agent was registered with."""
        statuses = list(statuses)
        registered = q.registered_types_txn(conn, [s.agent_id for s, _ in statuses])
        accepted = []
        for status, item in statuses:
            wrong = _wrong_reporter(status, item.agent, registered.get(status.agent_id))
            if wrong is None:
                accepted.append(_agent_row(status, changes.now))
            else:
                changes.reject(RejectReason.WRONG_AGENT, wrong, item.raw)
        q.upsert_agents_txn(conn, accepted)

    def reject(self, raw: str, reason: RejectReason, detail: str) -> None:
        """Record a message as rejected, in a transaction of its own."""
        changes = Changes(self.clock())
        message = intake.parse(raw, self.settings.max_payload_bytes)
        where = {} if isinstance(message, Refused) else intake.where(message)
        changes.reject(reason, detail, raw, **where)
        with self.db.begin() as conn:
            changes.write(conn)

    def _parse(self, raw: str, changes: Changes) -> AnyAgentMessage | None:
        message = intake.parse(raw, self.settings.max_payload_bytes)
        if isinstance(message, Refused):
            changes.reject(
                message.reason,
                message.detail,
                raw,
                machine_id=message.machine_id,
                state=message.state,
                attempt=message.attempt,
            )
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
        attempt = intake.attempt_of(message, machine.attempt)  # its token was checked unlocked
        where = {**intake.where(message), "attempt": attempt}
        definition = self._definition(conn, row.type, row.definition_version)
        if isinstance(message, StateHeartbeat):
            self._heartbeat(row, machine, definition, message, attempt, changes, raw)
            return
        if isinstance(message, StateHandBack):
            decision = decide(
                definition, machine, HandBack(message.state, attempt, message.reason), self.limits
            )
            event = "handback"
        else:
            ack = Ack(message.state, attempt, message.success, message.output, message.error)
            decision = decide(definition, machine, ack, self.limits)
            event = "ack"
        if isinstance(decision, Rejected):
            changes.reject(decision.reason, decision.detail, raw, **where)
            return
        if decision.failure is FailureKind.INVALID_OUTPUT:
            changes.reject(RejectReason.INVALID_OUTPUT, decision.error or "", raw, **where)
        changes.transition(row, decision, event)

    def _heartbeat(
        self,
        row: q.AnyRow,
        machine: Machine,
        definition: MachineDefinition,
        message: StateHeartbeat,
        attempt: int,
        changes: Changes,
        raw: str,
    ) -> None:
        rejected = check_event(machine, message.state, attempt)
        if rejected is not None:
            where = {**intake.where(message), "attempt": attempt}
            changes.reject(rejected.reason, rejected.detail, raw, **where)
            return
        state = definition.state(machine.current_state)
        entered = aware(row.entered_at) or changes.now
        deadline = state.heartbeat_deadline(entered, changes.now, self._longest_attempt)
        changes.heartbeat(row, deadline, message.progress)

    # timeouts, commands and the scan -----------------------------------------------------

    def scan(self, limit: int = 500) -> tuple[int, list[Step]]:
        """Time out attempts past their deadline and enter the states whose dispatch is due
        (since FSM_DISPATCH_GRACE_SECONDS: until then, an enter_state task is on its way).

        The database is the truth: this also repairs a dispatch lost with a killed worker, a
        dropped message or a flushed Redis. Rows another transaction holds are skipped. Returns
        how many machines it handled (a full batch: scan again at once) and the retries it
        scheduled after a delay.
        """
        changes = Changes(self.clock())
        with self.db.begin() as conn:
            overdue = q.lock_overdue_txn(conn, changes.now, limit)
            for row in overdue:
                self._contained(row, self._time_out, conn, row, changes)
            grace = timedelta(seconds=self.settings.dispatch_grace_seconds)
            due = q.lock_due_txn(conn, changes.now - grace, limit)
            rows = {row.id: row for row in (*overdue, *due)}
            for mid in changes.due_now():
                self._contained(
                    rows[mid], self._enter, conn, rows[mid], changes.snapshots[mid], changes
                )
            for row in due:
                self._contained(row, self._enter, conn, row, snapshot(row), changes)
            self._finish(conn, changes)
        return len(overdue) + len(due), [s for s in changes.steps() if s.delay > 0]

    def _time_out(self, conn: Connection, row: q.AnyRow, changes: Changes) -> None:
        definition = self._definition(conn, row.type, row.definition_version)
        decision = decide(definition, snapshot(row), Timeout(row.current_state, row.attempt))
        assert not isinstance(decision, Rejected)  # the query chose dispatched attempts
        changes.transition(row, decision, "timeout")

    @staticmethod
    def _contained(row: q.AnyRow, work: Callable[..., None], *args: Any) -> None:
        """Do one machine's part of a scan; an error of that machine alone (not of the
        database, which fails the whole transaction) is logged and the scan goes on: the
        machine stays due and is tried again by the next scan."""
        try:
            work(*args)
        except sqlalchemy.exc.SQLAlchemyError:
            raise
        except Exception:
            log.exception("the scan could not handle machine %s; it goes on without it", row.id)

    def prune(self, batch: int = 1000, most: int = 50) -> tuple[int, int]:
        """Delete rejected messages and unregistered agents past their retention, in small
        transactions (a flood of junk leaves a bounded table, and no long lock); how many of
        each were deleted."""
        now = self.clock()
        rejections = timedelta(days=self.settings.rejected_retention_days)
        silence = timedelta(days=self.settings.agent_retention_days)
        pruned = [0, 0]
        for i, (prune, age) in enumerate(
            ((q.prune_rejections_txn, rejections), (q.prune_agents_txn, silence))
        ):
            for _ in range(most):
                with self.db.begin() as conn:
                    deleted = prune(conn, now - age, batch)
                pruned[i] += deleted
                if deleted < batch:
                    break
        return pruned[0], pruned[1]

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


BAD_TOKEN = "missing or invalid taskToken for this machine, state and attempt"


class _Senders:
    """Checks that a message was sent by the machine's agent, when its sender is known."""

    def __init__(self, conn: Connection) -> None:
        self._conn = conn
        self._types: dict[UUID, str] = {}

    def wrong_agent(self, row: q.AnyRow, sender: UUID | None) -> str | None:
        """Why the sender may not move the machine, or None (also for a sender not known)."""
        if sender is None or row.agent_id == sender:
            return None
        if row.agent_id is not None:
            return f"machine {row.id} is assigned to agent {row.agent_id}, not {sender}"
        # An unassigned machine's task went to its agent type's stream: any agent of the type.
        if sender not in self._types:
            self._types.update(q.agent_types_txn(self._conn, [sender]))
        if self._types.get(sender) == row.agent_type:
            return None
        return (
            f"machine {row.id} is for agents of type {row.agent_type!r}; agent {sender} is not one"
        )


def _wrong_reporter(status: AgentStatus, sender: UUID | None, registered: str | None) -> str | None:
    """Why an agent_status must be refused: sent from another agent's stream, or claiming a
    type other than the one the agent was registered with."""
    if sender is not None and status.agent_id != sender:
        return f"agent {sender} reported a status for agent {status.agent_id}"
    if registered is not None and status.agent_type != registered:
        return (
            f"agent {status.agent_id} is registered as type {registered!r}, "
            f"not {status.agent_type!r}"
        )
    return None


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


def _checked_context(context: Mapping[str, Any] | None, max_bytes: int) -> dict[str, Any]:
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


def _agent_uuid(agent_id: UUID | str | None) -> UUID | None:
    if agent_id is None or isinstance(agent_id, UUID):
        return agent_id
    try:
        return UUID(str(agent_id))
    except ValueError:
        raise InvalidAgentId(agent_id) from None


def _ms(value: timedelta | None) -> int | None:
    return None if value is None else int(value.total_seconds() * 1000)


def _fits_int32(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= INT32_MAX
