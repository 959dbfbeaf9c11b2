"""Agents' messages, a batch in one transaction: acks and hand-backs move machines on,
heartbeats extend deadlines, statuses keep the agent registry, and every message that may not
change anything is recorded as rejected, with the reason. A message that breaks its batch's
transaction is isolated (the Applier), so that it cannot hold back or take down the messages
around it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from datetime import datetime, timedelta
from typing import Any, Generic, Protocol, TypeVar
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core import intake
from fsm_celery.core.attempt_events import Ack, HandBack
from fsm_celery.core.clock import aware
from fsm_celery.core.correction import Refusal, refusal
from fsm_celery.core.definition import FailureKind, MachineDefinition
from fsm_celery.core.intake import Refused
from fsm_celery.core.messages import (
    AgentStatus,
    AnyAgentMessage,
    MachineMessage,
    StateHandBack,
    StateHeartbeat,
)
from fsm_celery.core.steps import Next
from fsm_celery.core.transition import Machine, Rejected, RejectReason, check_event, decide
from fsm_celery.engine.entry import Entry
from fsm_celery.engine.ports import Handoff, Inbound
from fsm_celery.engine.refusals import refuse
from fsm_celery.engine.runtime import Runtime
from fsm_celery.exceptions import Unstorable
from fsm_celery.store import agents as agent_store
from fsm_celery.store import queries as q
from fsm_celery.store.rows import AgentReport
from fsm_celery.store.sent import Sent
from fsm_celery.store.writes import Writes

log = logging.getLogger(__name__)

BAD_TOKEN = "missing or invalid taskToken for this machine, state and attempt"


class Carrying(Protocol):
    """A message as the acks side read it (fsm_celery.acks.consumer.Envelope)."""

    @property
    def item(self) -> Inbound: ...


T = TypeVar("T", bound=Carrying)
Operation = Callable[[list[Inbound]], Next]  # apply a batch in one transaction
Reject = Callable[[str, RejectReason, str], None]  # record one message as rejected, alone


class Inbox:
    def __init__(self, runtime: Runtime, entry: Entry) -> None:
        self._rt = runtime
        self._entry = entry
        self._longest_attempt = timedelta(seconds=runtime.settings.max_attempt_seconds)

    def apply(self, batch: Iterable[Inbound], sent: Sent | None = None) -> Next:
        """Apply a batch of raw agent messages in one transaction; what becomes of the states
        it moved machines to is the Entry's Onward: entered now, their state_tasks sent before
        it commits, those it started after it (inline; the Next holds the states that wait out
        a retry delay), or all of them handed on in the Next, nothing sent (celery). Those
        that a failed try of the same messages sent (`sent`) are recorded, not sent again."""
        decided = self._apply_batch(batch, sent)
        if any(step.parent_id is not None for step in decided):  # else nothing to do after
            return self._entry.onward.after(self._entry, decided)
        return decided

    def _apply_batch(self, batch: Iterable[Inbound], sent: Sent | None) -> Next:
        settings = self._rt.settings
        writes = Writes(self._rt.clock(), sent=sent)
        parsed: list[tuple[MachineMessage, Inbound]] = []
        statuses: dict[UUID, tuple[AgentStatus, Inbound]] = {}
        for item in batch:
            message = self._parse(item.raw, writes)
            if isinstance(message, AgentStatus):
                statuses[message.agent_id] = (message, item)  # each agent's latest report
            elif message is None:
                continue
            elif intake.forged(message, settings.token_secrets, settings.accept_unsigned_acks):
                writes.reject(RejectReason.BAD_TOKEN, BAD_TOKEN, item.raw, **intake.where(message))
            else:
                parsed.append((message, item))
        with self._rt.transaction(writes) as conn:
            # the machines locked first, the agents' rows after them, as every transaction
            # does (entering a state marks its agent assigned as it writes): a batch that
            # recorded statuses first deadlocked with an entry holding one of its machines
            rows = q.lock_machines_txn(conn, [m.machine_id for m, _ in parsed])
            self._record_statuses(conn, statuses.values(), writes)
            senders = _Senders(conn)
            for message, item in parsed:
                row = rows.get(message.machine_id)
                where = intake.where(message)
                if row is None:
                    detail = f"no machine {message.machine_id}"
                    writes.reject(RejectReason.UNKNOWN_MACHINE, detail, item.raw, **where)
                elif (wrong := senders.wrong_agent(row, item.agent)) is not None:
                    writes.reject(RejectReason.WRONG_AGENT, wrong, item.raw, **where)
                else:
                    self._apply(conn, row, message, item, writes)
            self._entry.finish_txn(conn, rows, writes)
        if self._rt.observer is not None:
            self._rt.observer.acks_applied(writes, parsed)
        return writes.next()

    def reject(self, raw: str, reason: RejectReason, detail: str) -> None:
        """Record a message as rejected, in a transaction of its own (one the batch's
        transaction could not take: see Applier)."""
        writes = Writes(self._rt.clock())
        message = intake.parse(raw, self._rt.settings.max_payload_bytes)
        where = {} if isinstance(message, Refused) else intake.where(message)
        writes.reject(reason, detail, raw, **where)
        with self._rt.transaction(writes) as conn:  # counted as every transaction is
            writes.write(conn)

    def _parse(self, raw: str, writes: Writes) -> AnyAgentMessage | None:
        message = intake.parse(raw, self._rt.settings.max_payload_bytes)
        if isinstance(message, Refused):
            writes.reject(
                message.reason,
                message.detail,
                raw,
                machine_id=message.machine_id,
                state=message.state,
                attempt=message.attempt,
            )
            return None
        return message

    def _record_statuses(
        self, conn: Connection, statuses: Iterable[tuple[AgentStatus, Inbound]], writes: Writes
    ) -> None:
        """Record each agent's report, unless it came from another agent's stream, claims a
        type other than the one the agent was registered with, or its credentials were revoked
        (a report it wrote before, read after)."""
        statuses = list(statuses)
        registered = agent_store.registrations_txn(conn, [s.agent_id for s, _ in statuses])
        accepted = []
        for status, item in statuses:
            wrong = _wrong_reporter(status, item.agent, registered.get(status.agent_id))
            if wrong is None:
                accepted.append(_report(status, writes.now))
            else:
                writes.reject(RejectReason.WRONG_AGENT, wrong, item.raw)
        agent_store.upsert_agents_txn(conn, accepted)

    def _apply(
        self,
        conn: Connection,
        row: q.AnyRow,
        message: MachineMessage,
        item: Inbound,
        writes: Writes,
    ) -> None:
        raw = item.raw
        machine = writes.machine(row)
        attempt = intake.attempt_of(message, machine.attempt)  # its token was checked unlocked
        where = {**intake.where(message), "attempt": attempt}
        key = (row.type, row.definition_version)  # parsed already, nearly always: read
        definition = self._rt.catalog.parsed.get(key) or self._rt.catalog.version(conn, *key)
        if isinstance(message, StateHeartbeat):
            self._heartbeat(row, machine, definition, message, attempt, writes, raw)
            return
        limits = self._rt.limits
        if isinstance(message, StateHandBack):
            handback = HandBack(message.state, attempt, message.reason)
            decision = decide(definition, machine, handback, limits)
            event = "handback"
        else:
            ack = Ack(message.state, attempt, message.success, message.output, message.error)
            refused = refusal(definition, machine, ack, limits)
            if refused is not None:
                self._refuse(writes, row, refused, ack, item, where)
                return
            decision = decide(definition, machine, ack, limits)
            event = "ack"
        if isinstance(decision, Rejected):
            writes.reject(decision.reason, decision.detail, raw, **where)
            return
        try:
            writes.transition(row, decision, event)
        except Unstorable as exc:  # refused alone, before the batch sends anything
            writes.reject(RejectReason.INVALID_VALUE, exc.detail, raw, **where)
            return
        if decision.failure is FailureKind.INVALID_OUTPUT:
            writes.reject(RejectReason.INVALID_OUTPUT, decision.error or "", raw, **where)

    def _refuse(
        self,
        writes: Writes,
        row: q.AnyRow,
        refused: Refusal,
        ack: Ack,
        item: Inbound,
        where: dict[str, Any],
    ) -> None:
        """Send the answer back to be corrected; a refusal that cannot be stored is the
        message's rejection, alone, before the batch sends anything."""
        secret = self._rt.settings.token_secrets[0]
        try:
            refuse(writes, row, refused, ack.output, item.agent, secret)
        except Unstorable as exc:
            writes.reject(RejectReason.INVALID_VALUE, exc.detail, item.raw, **where)

    def _heartbeat(
        self,
        row: q.AnyRow,
        machine: Machine,
        definition: MachineDefinition,
        message: StateHeartbeat,
        attempt: int,
        writes: Writes,
        raw: str,
    ) -> None:
        rejected = check_event(machine, message.state, attempt)
        if rejected is not None:
            where = {**intake.where(message), "attempt": attempt}
            writes.reject(rejected.reason, rejected.detail, raw, **where)
            return
        state = definition.state(machine.current_state)
        entered = aware(row.entered_at) or writes.now
        deadline = state.heartbeat_deadline(entered, writes.now, self._longest_attempt)
        writes.heartbeat(row, deadline, message.progress)


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
            self._types.update(agent_store.type_of_agents_txn(self._conn, [sender]))
        if self._types.get(sender) == row.agent_type:
            return None
        return (
            f"machine {row.id} is for agents of type {row.agent_type!r}; agent {sender} is not one"
        )


def _wrong_reporter(
    status: AgentStatus, sender: UUID | None, registered: agent_store.Registration | None
) -> str | None:
    """Why an agent_status must be refused: sent from another agent's stream, from an agent
    whose credentials were revoked, or claiming a type other than the one the agent was
    registered with."""
    if sender is not None and status.agent_id != sender:
        return f"agent {sender} reported a status for agent {status.agent_id}"
    if registered is None:
        return None
    if registered.revoked:
        return f"agent {status.agent_id}'s credentials were revoked"
    if registered.agent_type is not None and status.agent_type != registered.agent_type:
        return (
            f"agent {status.agent_id} is registered as type {registered.agent_type!r}, "
            f"not {status.agent_type!r}"
        )
    return None


def _report(status: AgentStatus, now: datetime) -> AgentReport:
    return AgentReport(
        id=status.agent_id,
        agent_type=status.agent_type,
        status=status.status,
        concurrency=status.concurrency,
        running=status.running,
        hostname=status.hostname,
        started_at=now,
        last_seen_at=now,
    )


class Applier(Generic[T]):
    """Applies raw agent messages (acks, hand-backs, heartbeats, statuses) in batches and hands
    on the states they decided and did not enter.

    A batch that fails for a reason other than a transient one is split and applied message by
    message, so that one message the database refuses is recorded as rejected instead of
    holding back, or taking down, the messages around it. A message that cannot even be
    recorded is returned to the caller, which tries it again and, past a few tries, parks it
    (fsm_celery.core.parking): nothing is dropped, and nothing stalls.

    One Applier serves both modes: in the bridge its operation is an inline engine's
    `Inbox.apply` (the states due now entered in the batch's transaction), in fsm.apply_acks a
    celery one's (every state decided handed on). Inline, the operation keeps a Sent across
    tries: the state_tasks a failed try sent before its write was refused are recorded by the
    split, or the next try, without being sent again (DESIGN.md, invariant 8).
    """

    def __init__(
        self,
        operation: Operation,
        reject: Reject,
        handoff: Handoff,
        transient: tuple[type[Exception], ...],
    ) -> None:
        self.operation, self.reject, self.handoff = operation, reject, handoff
        self.transient = transient  # the surroundings away (fsm_celery.channel.transient)

    def __call__(self, batch: list[T]) -> list[T]:
        """Apply the batch; the messages neither applied nor recorded. Raises only transient
        errors (the caller keeps the whole batch and tries again)."""
        try:
            next_states = self.operation([d.item for d in batch])
        except self.transient:
            raise
        except Exception as exc:
            if len(batch) > 1:
                return [failed for envelope in batch for failed in self([envelope])]
            return self._reject(batch[0], exc)
        self._hand_on(len(batch), next_states)
        return []

    def _hand_on(self, applied: int, next_states: Next) -> None:
        """Hand the committed batch's states on. Redis or the broker away (a failover) loses
        nothing: each state's dispatch is due in PostgreSQL and the scan enters it. Trying the
        task again (or Celery's `reject requeue=False` when even that cannot be sent) would read
        as a batch lost, so the log says what happened instead."""
        try:
            self.handoff(next_states)
        except self.transient as exc:
            log.warning(
                "applied and committed %d messages; the %d states they moved machines to could "
                "not be handed on (%s): nothing is lost, the scan enters each when it is due",
                applied,
                len(next_states),
                _first_line(exc),
            )

    def _reject(self, envelope: T, error: Exception) -> list[T]:
        log.error("a message could not be applied; it is recorded as rejected", exc_info=error)
        detail = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        try:
            self.reject(envelope.item.raw, RejectReason.UNPROCESSABLE, detail)
        except self.transient:
            raise
        except Exception:
            log.exception("the rejection of a message could not be recorded either")
            return [envelope]
        return []


def _first_line(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}"
