"""The write-set, the store's unit of work: what one transaction decided, as typed rows
(machine moves, dispatches, heartbeats, history and rejections), written in one go, and what it
sends (its state_tasks before it commits, its events and cancels after). The engine's modules
record into it; it decides nothing.
"""

from __future__ import annotations

from dataclasses import InitVar, dataclass, field, replace
from datetime import datetime, timedelta
from typing import Any, Protocol
from uuid import UUID

from pydantic import ValidationError
from sqlalchemy import Connection

from fsm_celery.core import timeline
from fsm_celery.core.clock import aware, duration_ms
from fsm_celery.core.messages import (
    EVENT_ERROR_CHARS,
    INT32_MAX,
    StateEvent,
    StateTask,
)
from fsm_celery.core.steps import Next, Step
from fsm_celery.core.transition import Machine, MachineStatus, RejectReason, Transition
from fsm_celery.core.usage import Budget, Usage
from fsm_celery.exceptions import Unstorable
from fsm_celery.store import queries as q
from fsm_celery.store.rows import (
    Beat,
    Correction,
    Dispatch,
    History,
    Move,
    NewMachine,
    Rejection,
    unfit,
)
from fsm_celery.store.sent import Sending, Sent

KEEPS_ERROR = (MachineStatus.FAILED, MachineStatus.PAUSED)  # why it failed, or why it paused
ENDED = (MachineStatus.COMPLETED, MachineStatus.FAILED, MachineStatus.CANCELLED)
RUNNING = MachineStatus.RUNNING.value

Rows = dict[UUID, q.AnyRow]  # the machines a transaction holds (locked, or started by it)


class Part(Protocol):
    """What a module keeps for one transaction (the slots' ledger, the fan-outs' progress,
    the agents' routing): made on first use, its own rows written with the transaction's."""

    def write(self, conn: Connection, writes: Writes) -> None: ...


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
        corrections=row.corrections,
    )


class Outgoing:
    """What one transaction sends: its state_tasks before it commits (`to_send`, where each
    went in `sending`), its transitions' events and its state_cancels once it committed
    (fsm_celery.engine.runtime.Runtime.transaction). A state_task a failed try sent already
    (`sent`) is recorded where it went, not sent again (Writes.dispatch fills it)."""

    def __init__(self, sent: Sent | None = None) -> None:
        self.sent = sent
        self.to_send: list[tuple[str, str]] = []  # (agent, state_task)
        self.sending: dict[Sending, str] = {}  # dispatched here: where to
        self.announced: list[Announced] = []  # its events, announced once committed
        self._events: list[StateEvent] = []
        self.cancels: list[tuple[str, str]] = []  # (agent, state_cancel), too
        self.refusals: list[tuple[str, str]] = []  # (agent, state_ack_refused), too
        self.calls: list[Step] = []  # tool states entered: their calls made once committed

    @property
    def events(self) -> list[StateEvent]:
        """The transitions' events, made when asked for (once the transaction committed: the
        Python of a fan-out's thousand events a batch is not spent while it holds the parent's
        row lock)."""
        made = self._events
        made.extend(announced.event() for announced in self.announced[len(made) :])
        return made


@dataclass(frozen=True, slots=True)
class Announced:
    """A history row's event as recorded in the transaction, made into its StateEvent later."""

    history: History
    machine_type: str
    agent_type: str
    github_issue: int | None
    parent_id: UUID | None
    root_id: UUID | None
    status: str
    state_retries: int

    def event(self) -> StateEvent:
        """Its StateEvent: validated (pydantic's validator, compiled, takes a quarter of the
        time model_construct's Python does), or, should a value not pass, built as it is."""
        fields = self._fields()
        try:
            return StateEvent.model_validate(fields)
        except ValidationError:  # committed already: announced all the same
            return StateEvent.model_construct(**fields)

    def _fields(self) -> dict[str, Any]:
        history, error = self.history, self.history.error_message
        return dict(
            machine_id=history.machine_id,
            machine_type=self.machine_type,
            agent_type=self.agent_type,
            agent_id=history.agent_id,
            github_issue=self.github_issue,
            parent_id=self.parent_id,
            root_id=self.root_id,
            event=history.event,
            from_state=history.from_state,
            to_state=history.to_state,
            status=self.status,
            attempt=history.attempt,
            state_retries=self.state_retries,
            success=history.success,
            error=error[:EVENT_ERROR_CHARS] if error is not None else None,
            actor=history.actor,
            duration_ms=history.duration_ms,
            at=history.created_at,
        )


@dataclass
class Writes:
    """Collects the writes of one transaction (machine moves, dispatches, heartbeats, history
    and rejections), then writes them in one go; what it sends is its Outgoing's.

    It also knows which machines the transaction moved on, to which attempt, and which of
    those it entered: from that come the states still to enter (`next`), the one answer every
    use case gives. What other modules keep for the transaction are its `parts`.
    """

    now: datetime
    sent: InitVar[Sent | None] = None  # what failed transactions sent (kept by the caller)
    moves: dict[UUID, Move] = field(default_factory=dict)
    dispatches: dict[UUID, Dispatch] = field(default_factory=dict)  # of machines not moved
    beats: dict[UUID, Beat] = field(default_factory=dict)
    corrections: dict[UUID, Correction] = field(default_factory=dict)  # answers refused
    history: list[History] = field(default_factory=list)
    rejections: list[Rejection] = field(default_factory=list)
    machines: dict[UUID, Machine] = field(default_factory=dict)  # as moved in this transaction
    read: dict[UUID, tuple[q.AnyRow, Machine]] = field(default_factory=dict)  # each row's, once
    delays: dict[UUID, float] = field(default_factory=dict)
    types: dict[UUID, str] = field(default_factory=dict)
    roots: dict[UUID, UUID | None] = field(default_factory=dict)  # each moved machine's root
    entered: set[UUID] = field(default_factory=set)
    log: list[tuple[q.AnyRow, Transition, str]] = field(default_factory=list)  # in order
    followed: int = 0  # of the log, the transitions followed up (engine.entry)
    spawned: dict[UUID, Step] = field(default_factory=dict)  # children started here
    out: Outgoing = field(init=False)
    parts: dict[type[Any], Any] = field(default_factory=dict)  # each module's own, by type

    def __post_init__(self, sent: Sent | None) -> None:
        self.out = Outgoing(sent)

    def machine(self, row: q.AnyRow) -> Machine:
        """The machine as this transaction has left it so far."""
        moved = self.machines.get(row.id)
        if moved is not None:
            return moved
        read = self.read.get(row.id)
        if read is None or read[0] is not row:  # the row read again since: its own snapshot
            read = self.read[row.id] = (row, snapshot(row))
        return read[1]

    def transition(
        self,
        row: q.AnyRow,
        t: Transition,
        event: str,
        *,
        actor: str | None = None,
        reason: str | None = None,
    ) -> None:
        """Record a decided transition: the machine's new state and the attempt's history row.

        Raises Unstorable, having recorded nothing, when a value would not fit its column: the
        caller refuses that transition alone, before anything is sent (a write refused after
        the transaction's state_tasks went out would roll back moves already dispatched).
        """
        machine = self.machine(row)
        spent = machine.usage + t.usage
        move = self._move(row, t, spent)
        history = self._history(row, machine, t, event, actor, reason)
        problem = unfit(move) or unfit(history)
        if problem is not None:
            raise Unstorable(str(row.id), problem)
        self.machines[row.id] = Machine(
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
        self.roots[row.id] = row.root_id
        self.entered.discard(row.id)  # entered earlier in this transaction, and left again
        self.moves[row.id] = move
        self.history.append(history)
        self.announce(history, row, t.status.value, t.state_retries)
        self.log.append((row, t, event))

    def refuse(self, row: q.AnyRow, history: History, agent: str, message: str) -> None:
        """Record an answer refused (its history row; the machine stays, one more correction
        used) and queue the state_ack_refused to its agent, sent once the transaction commits.

        Raises Unstorable, having recorded nothing, when the row would not fit its columns.
        """
        problem = unfit(history)
        if problem is not None:
            raise Unstorable(str(row.id), problem)
        machine = self.machine(row)
        used = machine.corrections + 1
        self.machines[row.id] = replace(machine, corrections=used)
        self.corrections[row.id] = Correction(row.id, used, self.now)
        self.history.append(history)
        self.announce(history, row, machine.status.value, machine.state_retries)
        self.out.refusals.append((agent, message))

    def _move(self, row: q.AnyRow, t: Transition, spent: Usage) -> Move:
        running = t.status is MachineStatus.RUNNING
        agent_type = t.agent_type or row.agent_type
        return Move(
            id=row.id,
            current_state=t.to_state,
            status=t.status.value,
            context=t.context,
            attempt=t.attempt,
            state_retries=t.state_retries,
            handbacks=t.handbacks,
            dispatch_due_at=self.now + timedelta(seconds=t.delay_seconds) if running else None,
            deadline_at=None,
            heartbeat_at=None,
            progress=None,
            tokens_used=spent.tokens,
            cost=spent.cost,
            entered_at=row.entered_at,
            error=t.error if t.status in KEEPS_ERROR else None,
            updated_at=self.now,
            agent_type=agent_type,
            agent_id=row.agent_id if row.agent_pinned or agent_type == row.agent_type else None,
        )

    def _history(
        self,
        row: q.AnyRow,
        machine: Machine,
        t: Transition,
        event: str,
        actor: str | None,
        reason: str | None,
    ) -> History:
        beat = self.beats.get(row.id)
        entered = aware(row.entered_at)
        # how long the state ran; a move out of a paused or ended machine (resume, retry,
        # force) times nothing: the time since it stopped is not the state's
        timed = machine.status is MachineStatus.RUNNING
        return History(
            machine_id=row.id,
            from_state=t.from_state,
            to_state=t.to_state,
            success=t.success,
            output=t.output,
            error_message=t.error,
            duration_ms=duration_ms(self.now - entered) if entered and timed else None,
            attempt=machine.attempt,
            event=event,
            actor=actor,
            reason=reason,
            progress=beat.progress if beat is not None else row.progress,
            agent_id=row.agent_id,
            tokens_used=t.usage.tokens,
            cost=t.usage.cost,
            created_at=self.now,
            machine_created_at=row.created_at,
            context_delta=timeline.change(machine.context, t.context) or {},  # {}: none
            failure=t.failure.value if t.failure is not None else None,
        )

    def announce(
        self,
        history: History,
        machine: q.AnyRow | NewMachine,
        status: str,
        state_retries: int = 0,
    ) -> None:
        """Queue the event of a machine's history row (and the retries its state has used after
        it), to be announced once the transaction commits."""
        self.out.announced.append(
            Announced(
                history,
                machine.type,
                machine.agent_type,
                machine.github_issue,
                machine.parent_id,
                machine.root_id,
                status,
                state_retries,
            )
        )

    def dispatch(
        self, task: StateTask, agent: str, agent_id: UUID | None, *, sent: bool | None = None
    ) -> None:
        """Record that the machine's attempt is sent now to `agent` (its uuid, or its type's
        stream) with its deadline, and queue it, unless a transaction that failed sent it
        already (see Sent; `sent` when the caller looked it up)."""
        machine_id = task.machine_id
        self.entering(machine_id, task.deadline, agent_id)
        sending = (machine_id, task.attempt, task.state)
        self.out.sending[sending] = agent
        if sent is None:
            sent = self.sent_before(*sending) is not None
        if not sent:
            self.out.to_send.append((agent, task.to_wire()))

    def queue(self, row: q.AnyRow) -> None:
        """Record that the machine's state waits for a slot of its agent type, from now (no
        deadline runs meanwhile)."""
        moved = self.moves.get(row.id)
        if moved is not None:
            moved.dispatch_due_at = None
            moved.deadline_at = None
            moved.queued_at = row.queued_at or self.now
        else:
            self.dispatches[row.id] = Dispatch(
                row.id, None, self.now, None, self.now, row.agent_id, row.queued_at or self.now
            )
        self.entered.add(row.id)

    def entering(self, machine_id: UUID, deadline: datetime, agent_id: UUID | None) -> None:
        """Record that the machine's state is entered now, with its deadline: its state_task
        sent, or its children started (it then waits for their join)."""
        moved = self.moves.get(machine_id)
        if moved is not None:  # decided in this transaction: one UPDATE does both
            moved.dispatch_due_at = None
            moved.entered_at = self.now
            moved.deadline_at = deadline
            moved.agent_id = agent_id
            moved.queued_at = None
        else:
            self.dispatches[machine_id] = Dispatch(
                machine_id, None, self.now, deadline, self.now, agent_id
            )
        self.entered.add(machine_id)

    def sent_before(self, machine_id: UUID, attempt: int, state: str) -> str | None:
        """Where a failed transaction sent this attempt's state_task, if one did."""
        sent = self.out.sent  # nearly always none pending: read, not asked
        return (
            sent.where((machine_id, attempt, state)) if sent is not None and sent.pending else None
        )

    def spawn(self, step: Step) -> None:
        """Record a child started in this transaction, its first state to enter."""
        self.spawned[step.machine_id] = step
        self.delays[step.machine_id] = 0.0

    def roll_up(self, row: q.AnyRow, usage: Usage) -> None:
        """Count a descendant's spending against a machine (its budget sees its children's; a
        machine not moved here has it added by the fan-outs' part, engine.kinds.joins)."""
        machine = self.machine(row)
        self.machines[row.id] = replace(machine, usage=machine.usage.rolled(usage))
        moved = self.moves.get(row.id)
        if moved is not None:
            total = Usage(moved.tokens_used, moved.cost).rolled(usage)
            moved.tokens_used, moved.cost = total.tokens, total.cost

    def due_now(self) -> list[UUID]:
        """Machines this transaction moved on whose next state is to be entered at once. Not the
        children it started: their rows are not there for others until it commits, and an ack
        for a state_task sent before then would find no machine; they are entered after it
        (Entry.enter_started), or by an fsm.enter_state task each."""
        return [
            mid
            for mid, move in self.moves.items()
            if move.status == RUNNING and not self.delays[mid] and mid not in self.entered
        ]

    def heartbeat(self, row: q.AnyRow, deadline: datetime, progress: str | None) -> None:
        """Record a sign of life: a later deadline, and the agent's progress text."""
        if progress is None:
            earlier = self.beats.get(row.id)
            progress = earlier.progress if earlier is not None else row.progress
        self.beats[row.id] = Beat(row.id, deadline, self.now, progress)

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
            Rejection(
                reason=reason.value,
                detail=detail,
                payload=payload,
                received_at=self.now,
                machine_id=machine_id,
                state=state[:50] if state is not None else None,
                attempt=attempt if attempt is not None and 0 <= attempt <= INT32_MAX else None,
            )
        )

    def next(self) -> Next:
        """The states this transaction moved machines to and did not enter, with their delays."""
        moved = [
            Step(
                mid,
                move.attempt,
                self.delays[mid],
                move.current_state,
                self.types[mid],
                root_id=self.roots[mid],
            )
            for mid, move in self.moves.items()
            if move.status == RUNNING and mid not in self.entered
        ]
        started = [
            step
            for mid, step in self.spawned.items()
            if mid not in self.entered and mid not in self.moves
        ]
        return moved + started

    def write(self, conn: Connection) -> None:
        """Write everything decided, and the parts' own rows (what it sends is sent by the
        caller, before commit)."""
        q.update_heartbeats_txn(conn, list(self.beats.values()))
        # before the moves: a machine refused, then moved on, in one transaction starts its
        # next attempt with none
        q.count_corrections_txn(conn, list(self.corrections.values()))
        q.move_machines_txn(conn, list(self.moves.values()), self.history)
        for part in self.parts.values():
            part.write(conn, self)
        q.mark_dispatched_txn(conn, list(self.dispatches.values()))
        q.insert_rejections_txn(conn, self.rejections)


def start_record(
    machine: NewMachine, actor: str | None = None, reason: str | None = None
) -> History:
    """A machine's start, its history row of attempt 0 (a child's names its parent)."""
    return History(
        machine_id=machine.id,
        from_state=None,
        to_state=machine.current_state,
        success=True,
        output=None,
        error_message=None,
        duration_ms=None,
        attempt=0,
        event="start",
        actor=actor,
        reason=reason,
        progress=None,
        agent_id=None,
        tokens_used=0,
        cost=0.0,
        created_at=machine.created_at,
        machine_created_at=machine.created_at,
        context_delta=timeline.started(machine.context),
    )
