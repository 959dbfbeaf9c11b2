"""The fan-out state kind: states whose work is done by children (parallel branches, a map
over a list, a machine of another definition), joined exactly once inside PostgreSQL.

Children are machines like any other: their state_tasks, acks, timeouts and history go the
one way every machine's do. What is particular happens inside the transaction of the use case
at hand (docs/fan-out.md): entering a fan-out state (`enter_txn`) records the fan-out, a slot
per child (a map's items live there, not in any message), and starts the first children,
whose first states are entered as any due state is: in this transaction (inline, the scan) or
by an fsm.enter_state task each (celery); the join (`join_now`), once the children's ends
decide it (engine/kinds/joins.py counts them), moves the parent on; and a parent that leaves
its state, is paused or resumed takes its children along (`leave_txn`).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core.admin import Action, Command, decide_command
from fsm_celery.core.attempt_events import DispatchFailed, Joined
from fsm_celery.core.definition import MachineDefinition, ParentCancel, StateDefinition
from fsm_celery.core.join import (
    Slot,
    SlotStatus,
    Verdict,
    describe,
    failure_of,
    kind_of,
    merge,
    opening,
    rule_for,
    to_cancel,
)
from fsm_celery.core.steps import Step
from fsm_celery.core.transition import MachineStatus, Rejected, Transition, decide, initial_context
from fsm_celery.engine.cancels import cancel_in_flight
from fsm_celery.engine.kinds.base import Entering
from fsm_celery.engine.kinds.plan import Branches, Planner, Refused, TooLarge
from fsm_celery.engine.runtime import Runtime
from fsm_celery.exceptions import Unstorable
from fsm_celery.store import fanouts
from fsm_celery.store import queries as q
from fsm_celery.store.rows import NewMachine
from fsm_celery.store.writes import Rows, Writes, start_record

PARENT = "parent"  # the actor of what a parent does to its children


class FanOut:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self.planner = Planner(runtime)

    def enter_txn(self, at: Entering) -> None:
        """Start the state's children and wait for their join; a parent resumed in the state
        waits for the fan-out it started before (and joins now if its join was decided while
        it was paused)."""
        conn, rows, row, definition, state, writes, _ = at
        machine = writes.machine(row)
        open_now = fanouts.open_fan_out_txn(conn, row.id)
        if open_now is not None and open_now.state == state.name:
            writes.entering(row.id, writes.now + state.timeout, row.agent_id)
            if open_now.verdict != Verdict.PENDING.value:
                self._join(conn, rows, row, definition, open_now, writes)
            return
        try:
            plan = self.planner.plan(conn, row, definition, state, machine.context)
        except Refused as exc:
            self._refuse(row, definition, state, exc, writes)
            return
        total = len(plan.inputs)
        rule = rule_for(state, total)
        tally, start = opening(rule)
        kind = kind_of(state).value
        opened = fanouts.Opened(state.name, kind, total, tally, plan.shared or None)
        fanouts.open_txn(conn, row.id, machine.attempt, opened, writes.now)
        fanouts.insert_slots_txn(conn, row.id, machine.attempt, plan.inputs)
        writes.entering(row.id, writes.now + state.timeout, row.agent_id)
        waiting = [(slot, {**plan.shared, **plan.inputs[slot]}) for slot in range(start)]
        self.start(conn, rows, row, machine.attempt, state, plan.branches, waiting, writes)
        if tally.verdict is not Verdict.PENDING:  # an empty map is met at once
            self.join_now(conn, rows, row, definition, machine.attempt, writes)

    def _refuse(
        self,
        row: q.AnyRow,
        definition: MachineDefinition,
        state: StateDefinition,
        exc: Refused,
        writes: Writes,
    ) -> None:
        """A fan-out that cannot start fails its state, nothing of it written: one planned past
        its bound (what an agent answered) by the state's failure edge, as a failed join; any
        other where it is, as a state whose instruction cannot be made."""
        machine = writes.machine(row)
        error = f"{state.name}: {exc}"
        if isinstance(exc, TooLarge):
            joined = Joined(state.name, machine.attempt, False, {}, error)
            decision = decide(definition, machine, joined, self._rt.limits)
            assert not isinstance(decision, Rejected)  # the machine is at that attempt
            writes.transition(row, decision, "join", reason=f"fan-out refused: {exc}")
            return
        failed = DispatchFailed(state.name, machine.attempt, error)
        decision = decide(definition, machine, failed, self._rt.limits)
        assert not isinstance(decision, Rejected)
        writes.transition(row, decision, "dispatch_error")

    def start(
        self,
        conn: Connection,
        rows: Rows,
        parent: q.AnyRow,
        attempt: int,
        state: StateDefinition,
        branches: Branches,
        waiting: Sequence[tuple[int, Mapping[str, Any]]],
        writes: Writes,
    ) -> None:
        """Start a child in each slot: its row, its start record, its first state due now."""
        now = writes.now
        children: list[NewMachine] = []
        for slot, context in waiting:
            branch, kind, version = branches[0] if state.map is not None else branches[slot]
            budget = kind.budget
            first = kind.state(kind.initial_state)
            children.append(
                NewMachine(
                    # the same in every try of one decision: a transaction retried after it sent
                    # the children's state_tasks starts the same children, and Sent knows them
                    id=uuid.uuid5(parent.id, f"{attempt}.{slot}"),
                    type=kind.type,
                    agent_type=kind.agent_type_of(first),
                    current_state=kind.initial_state,
                    context=initial_context(kind, context),
                    status=MachineStatus.RUNNING.value,
                    github_issue=parent.github_issue,
                    created_at=now,
                    updated_at=now,
                    definition_version=version,
                    agent_id=None,
                    agent_pinned=False,
                    budget_tokens=budget.tokens if budget else None,
                    budget_cost=budget.cost if budget else None,
                    attempt=1,
                    state_retries=0,
                    dispatch_due_at=now,
                    parent_id=parent.id,
                    parent_attempt=attempt,
                    slot=slot,
                    branch=branch if branch is not None else str(slot),
                    root_id=parent.root_id or parent.id,
                    depth=parent.depth + 1,
                    on_parent_cancel=state.on_parent_cancel.value,
                )
            )
        rows.update((row.id, row) for row in fanouts.insert_machines_txn(conn, children))
        why = f"started by {parent.id} in {state.name}, slot "
        started = [start_record(child, PARENT, why + str(child.branch)) for child in children]
        q.insert_transitions_txn(conn, started)
        for child, history in zip(children, started, strict=True):
            writes.announce(history, child, child.status)
            writes.spawn(
                Step(child.id, 1, 0.0, child.current_state, child.type, parent.id, child.root_id)
            )
        fanouts.start_slots_txn(
            conn, parent.id, attempt, {child.slot or 0: child.id for child in children}
        )

    def leave_txn(
        self,
        conn: Connection,
        rows: Rows,
        row: q.AnyRow,
        t: Transition,
        event: str,
        writes: Writes,
    ) -> None:
        """A parent paused, resumed or moved off a fan-out state (by other than its join, which
        closed its fan-out itself): its children follow (those whose state says
        on_parent_cancel: cancel), and a fan-out it left counts no more."""
        fan_out = fanouts.open_fan_out_txn(conn, row.id)
        if fan_out is None:
            return
        if event == Action.PAUSE.value:
            self._command(conn, rows, row.id, Action.PAUSE, ("running",), writes)
        elif event == Action.RESUME.value:
            self._command(conn, rows, row.id, Action.RESUME, ("paused",), writes)
        else:
            fanouts.close_txn(conn, row.id, fan_out.attempt, writes.now)
            fanouts.cancel_waiting_txn(conn, row.id, fan_out.attempt)
            why = f"{event}" + (f": {t.error}" if t.error else "")
            self._command(conn, rows, row.id, Action.CANCEL, ("running", "paused"), writes, why)

    def _command(
        self,
        conn: Connection,
        rows: Rows,
        parent_id: UUID,
        action: Action,
        statuses: tuple[str, ...],
        writes: Writes,
        why: str = "",
    ) -> None:
        """Give the parent's children in those statuses the command (those that follow it)."""
        ids = fanouts.children_txn(conn, parent_id, statuses)
        if not ids:
            return
        locked = q.lock_machines_txn(conn, ids)  # free: this transaction holds their parent
        rows.update(locked)
        reason = f"{action.value} of parent {parent_id}" + (f" ({why})" if why else "")
        command = Command(action, PARENT, reason)
        secret = self._rt.settings.token_secrets[0]
        for child_id in ids:
            child = locked[child_id]
            if child.on_parent_cancel == ParentCancel.ABANDON.value:
                continue
            definition = self._rt.catalog.version(conn, child.type, child.definition_version)
            decision = decide_command(definition, writes.machine(child), command)
            if isinstance(decision, Rejected):
                continue  # moved on in this transaction already
            writes.transition(child, decision, action.value, actor=PARENT, reason=reason)
            if action is not Action.RESUME:
                cancel_in_flight(writes, child, secret, reason)

    def join_now(
        self,
        conn: Connection,
        rows: Rows,
        parent: q.AnyRow,
        definition: MachineDefinition,
        attempt: int,
        writes: Writes,
        why: str | None = None,
    ) -> None:
        """Carry out the join this transaction just decided (its fan-out read as written)."""
        fan_out = fanouts.fan_out_txn(conn, parent.id, attempt)
        assert fan_out is not None
        self._join(conn, rows, parent, definition, fan_out, writes, why)

    def _join(
        self,
        conn: Connection,
        rows: Rows,
        parent: q.AnyRow,
        definition: MachineDefinition,
        fan_out: q.AnyRow,
        writes: Writes,
        why: str | None = None,
    ) -> None:
        """Carry out a decided join: cancel the children still out, then move the parent on
        with the merged output (met) or by its failure edge (failed). A parent paused keeps
        its fan-out open and joins when resumed."""
        attempt = fan_out.attempt
        slots = fanouts.slots_txn(conn, parent.id, attempt)
        cancelled = set(to_cancel(slots))
        if cancelled:
            fanouts.cancel_waiting_txn(conn, parent.id, attempt)
            reason = why or f"the join of {fan_out.state} was decided ({fan_out.verdict})"
            self._command(
                conn, rows, parent.id, Action.CANCEL, ("running", "paused"), writes, reason
            )
            slots = [
                Slot(s.index, SlotStatus.CANCELLED, None, "cancelled by the join")
                if s.index in cancelled
                else s
                for s in slots
            ]
        machine = writes.machine(parent)
        if machine.status is not MachineStatus.RUNNING or machine.current_state != fan_out.state:
            return
        state = definition.state(fan_out.state)
        rule = rule_for(state, fan_out.total)
        tally = fanouts.tally_of(fan_out)
        met = tally.verdict is Verdict.MET
        output = merge(definition, state, slots) if met else {}
        error = None if met else (why or failure_of(rule, tally, slots))
        reason = f"join {tally.verdict.value}: {describe(state, rule, tally, len(cancelled))}"
        if fan_out.decided_by is not None:
            reason += f"; decided by {fan_out.decided_by}"
        self._move_parent(parent, definition, machine.attempt, state, output, error, reason, writes)
        fanouts.close_txn(conn, parent.id, attempt, writes.now)

    def _move_parent(
        self,
        parent: q.AnyRow,
        definition: MachineDefinition,
        attempt: int,
        state: StateDefinition,
        output: dict[str, Any],
        error: str | None,
        reason: str,
        writes: Writes,
    ) -> None:
        """Move the parent on by its join: with the merged output, or by its failure edge (an
        error); `reason` says what the join was, in its history."""
        machine = writes.machine(parent)
        joined = Joined(state.name, attempt, error is None, output, error)
        decision = decide(definition, machine, joined, self._rt.limits)
        if isinstance(decision, Rejected):  # what the database cannot hold in the totals
            joined = Joined(state.name, attempt, False, {}, f"the join: {decision.detail}")
            decision = decide(definition, machine, joined, self._rt.limits)
        assert not isinstance(decision, Rejected)
        try:
            writes.transition(parent, decision, "join", reason=reason)
        except Unstorable as exc:  # a merged value its column cannot hold: refused, as an ack's
            joined = Joined(state.name, attempt, False, {}, f"the join's output: {exc.detail}")
            decision = decide(definition, machine, joined, self._rt.limits)
            assert not isinstance(decision, Rejected)
            writes.transition(parent, decision, "join", reason=f"{reason}; its output refused")

    def row(self, conn: Connection, rows: Rows, machine_id: UUID) -> q.AnyRow:
        """A machine this transaction holds (an ancestor of one it locked, or a child)."""
        found = rows.get(machine_id)
        if found is None:
            rows.update(q.lock_machines_txn(conn, [machine_id]))
            found = rows[machine_id]
        return found
