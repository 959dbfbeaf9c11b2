"""Entering a state, as its kind does (engine/kinds), and the end of every transaction that
moves machines: what it decided followed up (fan-outs settled, freed slots filled), its
state_tasks sent, its writes written with their hooks (gates left, notifications queued).

Every use case that moves a machine on enters the next state through here, in its own
transaction when the state is due now; the fsm.enter_state task enters it in a transaction of
its own when it was handed on. What an entry or an inbox batch does with the states it decided
is its Onward (EnterNow inline, HandOn celery), chosen where the process is built.
"""

from __future__ import annotations

import logging
import time
from datetime import timedelta
from typing import Protocol
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core.clock import aware
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.kinds import state_kind
from fsm_celery.core.steps import Next
from fsm_celery.core.transition import MachineStatus, Transition
from fsm_celery.engine.kinds import Entering, kinds
from fsm_celery.engine.kinds.approval import Opened
from fsm_celery.engine.kinds.fanout import FanOut
from fsm_celery.engine.kinds.joins import Joins
from fsm_celery.engine.notify import outbox_txn
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.slots import Ledger, Slots
from fsm_celery.store import gates
from fsm_celery.store import queries as q
from fsm_celery.store.sent import Sent
from fsm_celery.store.writes import ENDED, Rows, Writes

log = logging.getLogger(__name__)

EARLY = timedelta(milliseconds=50)  # how early a countdown may fire and still enter a state


class Onward(Protocol):
    """What becomes of the states that a transaction of agents' messages, or of entries, moved
    machines to: entered here (EnterNow, the inline mode: the due ones in that transaction, the
    children it started each in one of their own after it), or handed back in its Next, to be
    entered by an fsm.enter_state task each (HandOn, the celery mode). Chosen once, where the
    process is built (fsm_celery.wiring, from the transition mode), and given to the Entry."""

    def due_txn(self, entry: Entry, conn: Connection, rows: Rows, writes: Writes) -> None:
        """In the transaction, once its messages or entries are decided: what it enters."""
        ...

    def after(self, entry: Entry, decided: Next) -> Next:
        """After its commit, when it started children (else its Next is handed on as it is):
        what is left of its Next to hand on."""
        ...


class EnterNow:
    """The inline mode's Onward: the states due now are entered in the transaction that moved
    machines to them, and the children it started in transactions of their own after it."""

    def due_txn(self, entry: Entry, conn: Connection, rows: Rows, writes: Writes) -> None:
        entry.enter_due_txn(conn, rows, writes)

    def after(self, entry: Entry, decided: Next) -> Next:
        return entry.enter_started(decided)


class HandOn:
    """The celery mode's Onward: a transaction enters nothing but the machines queued for the
    slots it freed; every state it decided is handed on (an fsm.enter_state task each)."""

    def due_txn(self, entry: Entry, conn: Connection, rows: Rows, writes: Writes) -> None:
        entry.follow_up_txn(conn, rows, writes)

    def after(self, entry: Entry, decided: Next) -> Next:
        return decided


class Entry:
    def __init__(self, runtime: Runtime, onward: Onward) -> None:
        self._rt = runtime
        self.onward = onward  # what becomes of the states its entries decide
        self._slots = Slots(runtime)
        fanout = FanOut(runtime)
        self._kinds = kinds(runtime, self._slots, fanout)  # what entering a state does, by kind
        self._joins = Joins(runtime, fanout)
        self._sent = Sent()  # what an entry that failed sent: its task, run again, sends it not

    def enter(self, machine_id: UUID, attempt: int) -> Next:
        """Enter the attempt's state unless that was done already or it is not due yet (the
        scan enters it when due). A state that cannot be sent fails its attempt; what that
        leads to after a retry delay is returned. An entry whose write failed after its send
        (the database restarting) records, when tried again, the dispatch it sent."""
        return self.enter_many([(machine_id, attempt)])

    def enter_many(self, steps: list[tuple[UUID, int]]) -> Next:
        """enter, for each (machine, attempt), in one transaction (those another transaction
        holds, each in one of its own afterwards: see _enter)."""
        return self.onward.after(self, self._enter_locking_late(steps))

    def enter_started(self, next_states: Next) -> Next:
        """Enter the first states of the children a committed transaction started, in
        transactions of their own (the inline mode's way: no Celery hop); what is left to hand
        on. A crash before leaves them due, for the scan.

        A transaction of them that fails for a transient reason (PostgreSQL restarting) is
        tried again here, for up to FSM_DISPATCH_GRACE_SECONDS: it may have sent its
        state_tasks before its commit failed, and this Entry's Sent then records them without
        sending them again, where the scan, entering them later, would send them twice."""
        while started := [s for s in next_states if s.parent_id is not None and not s.delay]:
            later = [s for s in next_states if s.parent_id is None or s.delay]
            steps = [(s.machine_id, s.attempt) for s in started]
            next_states = later + self._enter_retrying(steps)
        return next_states

    def _enter_retrying(self, steps: list[tuple[UUID, int]]) -> Next:
        give_up = time.monotonic() + self._rt.settings.dispatch_grace_seconds
        pause = 0.1
        while True:
            try:
                return self._enter_locking_late(steps)
            except self._rt.transient:
                if time.monotonic() + pause > give_up:
                    raise
                log.warning("entering %d started children failed; trying again", len(steps))
                time.sleep(pause)
                pause = min(pause * 2, 1.0)

    def _enter_locking_late(self, steps: list[tuple[UUID, int]]) -> Next:
        """_enter, locking the machines alone, or if that moves a child, with their ancestors."""
        try:
            return self._enter(steps, ancestors=False)
        except _ChildMoved:
            return self._enter(steps, ancestors=True)

    def _enter(self, steps: list[tuple[UUID, int]], *, ancestors: bool) -> Next:
        """enter, locking the machines alone first: a child's entry concerns its parent only if
        it moves the child (its state cannot be sent), which is then done again with the
        parent locked first, in the one lock order (docs/fan-out.md). So the entries of a
        fan-out's children do not wait for each other on their parent's row.

        Locking children without their parent, a transaction must not wait for one child while
        it holds another: one that holds their parent may be about to lock both (a join
        cancelling the losers), having locked one of them already, with an ack. So several
        machines are locked skipping those others hold, and those are entered afterwards, one
        transaction each, where waiting holds nothing."""
        writes = Writes(self._rt.clock(), sent=self._sent)
        skip = len(steps) > 1 and not ancestors
        with self._rt.transaction(writes) as conn:
            ids = [mid for mid, _ in steps]
            rows = q.lock_machines_txn(conn, ids, ancestors=ancestors, skip_locked=skip)
            for machine_id, attempt in steps:
                row = rows.get(machine_id)
                if row is None or not _awaits_dispatch(row, attempt):
                    continue
                if aware(row.dispatch_due_at) > writes.now + EARLY:  # type: ignore[operator]
                    continue  # a retry delay is still running
                self.enter_txn(conn, rows, row, writes)
                if writes.log and row.parent_id is not None and not ancestors:
                    raise _ChildMoved  # rolled back, nothing sent: again, the parent first
            self.finish_txn(conn, rows, writes)
        entered = writes.next()
        for step in steps if skip else []:
            if step[0] not in rows:  # held by another transaction (or gone): alone
                entered += self._enter_locking_late([step])
        return entered

    def enter_due_txn(self, conn: Connection, rows: Rows, writes: Writes) -> None:
        """Settle what the transaction did to fan-outs, and enter the states it moved machines
        to, or started children in, that are due now; until nothing more is (a state entered
        may start children, a join may move a parent on)."""
        followed: int | None = None  # the transitions recorded when last followed up
        while followed != len(writes.log):  # else nothing new to settle, free, nor enter
            followed = len(writes.log)
            self.follow_up_txn(conn, rows, writes)
            due = writes.due_now()
            if not due:
                return
            for mid in due:
                self.enter_txn(conn, rows, rows[mid], writes)

    def follow_up_txn(self, conn: Connection, rows: Rows, writes: Writes) -> None:
        """Settle what the transaction did to fan-outs (see Joins), and enter the machines
        queued longest in the slots its transitions freed (see Slots); entering nothing else.

        Each runs only when a transition recorded since the last follow-up concerns it (a
        child's, or one from a fan-out state; one of a bounded agent type, or a slot taken
        here): a transaction of plain agent states asks neither."""
        start, writes.followed = writes.followed, len(writes.log)
        if any(
            row.parent_id is not None or (event != "join" and self._fans_out(conn, row, t))
            for row, t, event in writes.log[start:]
        ):
            self._joins.settle_txn(conn, rows, writes)
        bounds = self._slots.bounds  # with what settling recorded (a join's losers cancelled)
        if Ledger in writes.parts or any(
            bounds.of(conn, row.agent_type) is not None for row, _, _ in writes.log[start:]
        ):
            self._enter_queued(conn, rows, self._slots.release_txn(conn, writes), writes)

    def _fans_out(self, conn: Connection, row: q.AnyRow, t: Transition) -> bool:
        """Whether the transition moved the machine from a fan-out state."""
        return self._definition(conn, row).state(t.from_state).fans_out

    def reconcile_txn(self, conn: Connection, rows: Rows, writes: Writes) -> None:
        """Count again each bounded agent type's work in flight, and fill its free slots."""
        self._enter_queued(conn, rows, self._slots.reconcile_txn(conn, writes), writes)

    def _enter_queued(
        self, conn: Connection, rows: Rows, free: dict[str, int], writes: Writes
    ) -> None:
        for agent_type, most in free.items():
            for row in self._slots.queued_txn(conn, agent_type, most):
                rows[row.id] = row
                self.enter_txn(conn, rows, row, writes)

    def enter_txn(self, conn: Connection, rows: Rows, row: q.AnyRow, writes: Writes) -> None:
        """Enter the machine's state, as its kind does (engine/kinds): build its state_task,
        route it, and record it as sent (in this transaction); start its children; open its
        gate; or wait for its event. `rows` holds the machines the transaction locked, and
        those it starts."""
        definition = self._definition(conn, row)
        machine = writes.machine(row)
        state = definition.state(machine.current_state)
        at = Entering(conn, rows, row, definition, state, writes, machine)
        self._kinds[state_kind(state)].enter_txn(at)

    def finish_txn(self, conn: Connection, rows: Rows, writes: Writes) -> None:
        """The end of a transaction of agents' messages or entries, once they are decided: what
        its Onward enters in it, then its state_tasks sent and its changes written."""
        self.onward.due_txn(self, conn, rows, writes)
        self.send_and_write(conn, writes)

    def send_and_write(self, conn: Connection, writes: Writes) -> None:
        """Send the transaction's state_tasks, then write its changes; the caller commits.

        The rows are locked and the decision is made, so the tasks go out at once: the write
        and the commit (a few milliseconds under load) are not part of an agent's wait. A
        failure or a crash before the commit rolls the decision back and the message that caused
        it is delivered again. What the database is known to refuse (a number past its column,
        a NUL character) is refused before this, one message or machine alone (Writes.transition,
        fsm_celery.core.intake); and a caller that tries the same messages again with the same
        Sent (the batch applier, the scan) records those dispatches without sending them twice.
        Only a crash between the send and the commit sends a state_task twice (at least once);
        its duplicate ack is then refused as stale, and the work is applied once.
        """
        out = writes.out
        if out.to_send:  # the transport is asked only when there is something to send
            self._rt.dispatcher.dispatch_many(out.to_send)
        if out.sent is not None:
            out.sent.add(out.sending)  # until the commit (Runtime.transaction)
        writes.write(conn)
        self._leave_gates_txn(conn, writes)
        if any(t.status in ENDED for _, t, _ in writes.log):
            outbox_txn(conn, self._rt, writes)  # the ended machines' notifications

    def _leave_gates_txn(self, conn: Connection, writes: Writes) -> None:
        """Close, as `left`, the gates of the machines this transaction took away from them (a
        cancel, a force, a parent's cancel), once its moves are written: a gate no one can
        decide at any more is not left `pending`. Only machines that were at an approval state,
        or opened a gate here, are looked at."""
        opened = writes.parts.get(Opened)
        at_gates = set(opened.machines) if opened is not None else set()
        for row, _, _ in writes.log:
            if self._definition(conn, row).state(row.current_state).approval is not None:
                at_gates.add(row.id)
        if at_gates:
            gates.leave_txn(conn, sorted(at_gates), writes.now)

    def _definition(self, conn: Connection, row: q.AnyRow) -> MachineDefinition:
        """The machine's definition (parsed already, nearly always: read, not asked)."""
        key = (row.type, row.definition_version)
        return self._rt.catalog.parsed.get(key) or self._rt.catalog.version(conn, *key)


class _ChildMoved(Exception):
    """Entering a child moved it: its parent must be locked first (Entry._enter)."""


def _awaits_dispatch(row: q.AnyRow, attempt: int) -> bool:
    return (
        row.status == MachineStatus.RUNNING
        and row.attempt == attempt
        and row.dispatch_due_at is not None
    )
