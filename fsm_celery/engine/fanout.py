"""Fan-out: states whose work is done by children (parallel branches, a map over a list, a
machine of another definition), joined exactly once inside PostgreSQL.

Children are machines like any other: their state_tasks, acks, timeouts and history go the
one way every machine's do. What is particular happens in two places, both inside the
transaction of the use case at hand (docs/fan-out.md):

- entering a fan-out state (`enter_txn`) records the fan-out, a slot per child (a map's
  items live there, not in any message), and starts the first children, whose first states
  are entered as any due state is: in this transaction (inline, the scan) or by an
  fsm.enter_state task each (celery);
- `settle_txn` carries what the transaction's transitions mean for fan-outs: a child's end
  is counted in its parent's fan-out, the parent's row being locked already (the store locks a
  machine's ancestors with it), and when that decides the join the losers are cancelled and
  the parent moves on, here; a map's next items start in the slots freed; a parent paused,
  resumed or moved off its fan-out state takes its children along (to every depth); and
  children's spending counts against every ancestor's budget.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

import jmespath.exceptions
from sqlalchemy import Connection

from fsm_celery.core import inputs
from fsm_celery.core.admin import Action, Command, decide_command
from fsm_celery.core.attempt_events import DispatchFailed, Joined
from fsm_celery.core.context import context_problem
from fsm_celery.core.definition import (
    Body,
    MachineDefinition,
    ParentCancel,
    StateDefinition,
    compile_guard,
)
from fsm_celery.core.join import (
    Slot,
    SlotStatus,
    Tally,
    Verdict,
    describe,
    ended_together,
    failure_of,
    kind_of,
    merge,
    opening,
    rule_for,
    to_cancel,
)
from fsm_celery.core.transition import (
    LOOP_COUNT,
    LOOP_LIMIT,
    MachineStatus,
    Rejected,
    Transition,
    decide,
    initial_context,
)
from fsm_celery.engine.cancels import cancel_in_flight
from fsm_celery.engine.ports import Step
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.writes import ENDED, Writes, start_record
from fsm_celery.exceptions import InvalidChildInput, UnknownMachineType, Unstorable
from fsm_celery.store import fanouts
from fsm_celery.store import queries as q
from fsm_celery.store.rows import NewMachine

Rows = dict[UUID, q.AnyRow]
PARENT = "parent"  # the actor of what a parent does to its children


class Refused(Exception):
    """A fan-out that cannot start: what its state says does not fit its context."""


class TooLarge(Refused):
    """A fan-out whose children's starting contexts together are past FSM_MAX_FANOUT_BYTES."""


@dataclass(frozen=True)
class _Plan:
    """What a fan-out starts: each child's definition, type, version and starting context
    (what a map's children share, stored once, and each one's own part)."""

    # per branch (a map's one body): its name, definition and version
    branches: list[tuple[str | None, MachineDefinition, int]]
    inputs: list[dict[str, Any]]
    shared: dict[str, Any]


class FanOut:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    # ---- entering a fan-out state ----------------------------------------------------------

    def enter_txn(
        self,
        conn: Connection,
        rows: Rows,
        row: q.AnyRow,
        definition: MachineDefinition,
        state: StateDefinition,
        writes: Writes,
    ) -> None:
        """Start the state's children and wait for their join; a parent resumed in the state
        waits for the fan-out it started before (and joins now if its join was decided while
        it was paused)."""
        machine = writes.machine(row)
        open_now = fanouts.open_fan_out_txn(conn, row.id)
        if open_now is not None and open_now.state == state.name:
            writes.entering(row.id, writes.now + state.timeout, row.agent_id)
            if open_now.verdict != Verdict.PENDING.value:
                self._join(conn, rows, row, definition, open_now, writes)
            return
        try:
            plan = self._plan(conn, row, definition, state, machine.context)
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
        self._start(conn, rows, row, machine.attempt, state, plan.branches, waiting, writes)
        if tally.verdict is not Verdict.PENDING:  # an empty map is met at once
            self._join_now(conn, rows, row, definition, machine.attempt, writes)

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

    def _plan(
        self,
        conn: Connection,
        row: q.AnyRow,
        definition: MachineDefinition,
        state: StateDefinition,
        context: Mapping[str, Any],
    ) -> _Plan:
        settings = self._rt.settings
        if row.depth + 1 > settings.max_child_depth:
            raise Refused(
                f"its children would nest {row.depth + 1} deep, past "
                f"FSM_MAX_CHILD_DEPTH={settings.max_child_depth}"
            )
        children = definition.children(state)
        kinds = {
            branch: self._definition(conn, row, definition, state, branch, body)
            for branch, body in children
        }
        if state.map is None:
            inputs = [
                self._input(body, context, index, branch, kinds[branch][0])
                for index, (branch, body) in enumerate(children)
            ]
            _within(settings.max_fanout_bytes, [_size(built) for built in inputs])
            return _Plan([(branch, *kinds[branch]) for branch, _ in children], inputs, {})
        items = _items(state, context, settings.max_fanout_items)
        ((_, body),) = children
        shared, own = self._map_inputs(state, body, context, items)
        child = kinds[None][0]
        if child.context_schema is not None:  # checked once every size is known to fit
            for index, part in enumerate(own):
                _check_schema(child, {**shared, **part}, f"item {index}")
        return _Plan([(None, *kinds[None])], own, shared)

    def _definition(
        self,
        conn: Connection,
        row: q.AnyRow,
        definition: MachineDefinition,
        state: StateDefinition,
        branch: str | None,
        body: Body,
    ) -> tuple[MachineDefinition, int]:
        """A child's definition and version: another type's newest, or the parent's own inline
        states (in the parent's version: they are part of it)."""
        if body.machine is None:
            return definition.inline(state.name, branch), row.definition_version
        try:
            version, found = self._rt.catalog.latest(conn, body.machine)
        except UnknownMachineType as exc:
            raise Refused(f"machine {body.machine!r} is not a loaded definition") from exc
        return found, version

    def _input(
        self,
        body: Body,
        context: Mapping[str, Any],
        index: int,
        branch: str | None,
        child: MachineDefinition,
    ) -> dict[str, Any]:
        """A branch's or child machine's starting context: its input from the parent's
        context (and its position, as `index`), checked as a machine's start would be."""
        data = {"context": context, "item": None, "index": index}
        where = f"branch {branch}" if branch else "input"
        try:
            built = _evaluate(body.input, data, default=True, context=context)
        except Refused as exc:
            raise Refused(f"{where}: {exc}") from None
        self._fits(where, _size(built))
        _check_schema(child, built, where)
        return built

    def _map_inputs(
        self, state: StateDefinition, body: Body, context: Mapping[str, Any], items: list[Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A map's input: what its children share, rendered once, and each item's own part
        (its item under its item_key); each child's context and all of them together bounded
        before anything is written."""
        assert state.map is not None
        own: list[dict[str, Any]] = []
        try:
            parts = inputs.split(body.input)
            shared = inputs.shared_part(parts, context)
            for index, item in enumerate(items):
                data = {"context": context, "item": item, "index": index}
                own.append(inputs.own_part(parts, data) | {state.map.item_key: item})
        except InvalidChildInput as exc:
            raise Refused(f"item {len(own)}: {exc.detail}") from None
        shared_size = _size(shared)
        sizes = [inputs.joined_size(shared_size, _size(part)) for part in own]
        for index, size in enumerate(sizes):
            self._fits(f"item {index}", size)
        _within(self._rt.settings.max_fanout_bytes, sizes)
        return shared, own

    def _fits(self, where: str, size: int) -> None:
        most = self._rt.settings.max_context_bytes
        if size > most:
            raise Refused(
                f"{where}: the child's context would be {size} bytes, over the limit of {most}"
            )

    def _start(
        self,
        conn: Connection,
        rows: Rows,
        parent: q.AnyRow,
        attempt: int,
        state: StateDefinition,
        branches: list[tuple[str | None, MachineDefinition, int]],
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
        inserted = fanouts.insert_machines_txn(conn, children)
        why = f"started by {parent.id} in {state.name}, slot "
        started = [start_record(child, PARENT, why + str(child.branch)) for child in children]
        q.insert_transitions_txn(conn, started)
        for child, history, row in zip(children, started, inserted, strict=True):
            rows[row.id] = row
            writes.announce(history, child, child.status)
            writes.spawn(Step(child.id, 1, 0.0, child.current_state, child.type, parent.id))
        fanouts.start_slots_txn(
            conn, parent.id, attempt, {child.slot or 0: child.id for child in children}
        )

    # ---- what the transaction's transitions mean for fan-outs --------------------------------

    def settle_txn(self, conn: Connection, rows: Rows, writes: Writes) -> None:
        """Settle every transition the transaction recorded since the last call, and those
        that settling them records (a join moves a parent, which may be a child itself).

        Children's ends are counted deepest fan-out first, and each fan-out's ends together:
        a join that ends a parent which is itself a child (a nested branch completed by its own
        children) ends it in time to be counted with its siblings' ends of this transaction,
        never cancelled as a loser by a join they meet (DESIGN.md, invariant 10). Budgets are
        judged once every end is counted, an ancestor at a time."""
        ended: dict[tuple[UUID, int], list[tuple[q.AnyRow, Transition]]] = {}
        over_budget: dict[UUID, str] = {}
        while writes.settled < len(writes.log) or ended or over_budget:
            batch = writes.log[writes.settled :]
            writes.settled = len(writes.log)
            for row, t, event in batch:
                if row.parent_id is not None:
                    if t.usage.tokens or t.usage.cost:
                        over_budget |= self._roll_up(conn, rows, row, t, writes)
                    if t.status in ENDED:
                        ended.setdefault((row.parent_id, row.parent_attempt), []).append((row, t))
                self._follow(conn, rows, row, t, event, writes)
            if ended:
                self._settle_deepest(conn, rows, ended, writes)
            elif over_budget:  # the deepest first: the end its join makes counts in the next
                ancestor = max(over_budget, key=lambda a: self._row(conn, rows, a).depth)
                self._out_of_budget(conn, rows, ancestor, over_budget.pop(ancestor), writes)

    def _settle_deepest(
        self,
        conn: Connection,
        rows: Rows,
        ended: dict[tuple[UUID, int], list[tuple[q.AnyRow, Transition]]],
        writes: Writes,
    ) -> None:
        """Count the ends of the deepest children waiting to be counted (taken out of `ended`);
        the shallower wait for what these joins end."""
        deepest = max(children[0][0].depth for children in ended.values())
        for key in [key for key, children in ended.items() if children[0][0].depth == deepest]:
            self._children_ended(conn, rows, *key, ended.pop(key), writes)

    def _roll_up(
        self, conn: Connection, rows: Rows, row: q.AnyRow, t: Transition, writes: Writes
    ) -> dict[UUID, str]:
        """Count a child's spending against each ancestor; the ancestors it takes past their
        budget, and why."""
        over: dict[UUID, str] = {}
        ancestor_id = row.parent_id
        while ancestor_id is not None:
            ancestor = self._row(conn, rows, ancestor_id)
            writes.roll_up(ancestor, t.usage)
            machine = writes.machine(ancestor)
            exceeded = machine.budget.exceeded_by(machine.usage)
            if exceeded is not None and machine.status is MachineStatus.RUNNING:
                over[ancestor_id] = exceeded
            ancestor_id = ancestor.parent_id
        return over

    def _follow(
        self,
        conn: Connection,
        rows: Rows,
        row: q.AnyRow,
        t: Transition,
        event: str,
        writes: Writes,
    ) -> None:
        """A parent paused, resumed or moved off a fan-out state: its children follow (those
        whose state says on_parent_cancel: cancel), and a fan-out it left counts no more."""
        if event == "join":
            return  # the join closed its fan-out itself
        definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        if not definition.state(t.from_state).fans_out:
            return
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

    def _children_ended(
        self,
        conn: Connection,
        rows: Rows,
        parent_id: UUID,
        attempt: int,
        children: list[tuple[q.AnyRow, Transition]],
        writes: Writes,
    ) -> None:
        """Record the children's ends in their slots and count them in their fan-out: the
        next map items start in the slots freed, and the join, once decided, moves the parent."""
        fan_out = fanouts.fan_out_txn(conn, parent_id, attempt)
        if fan_out is None:
            return
        parent = self._row(conn, rows, parent_id)
        definition = self._rt.catalog.version(conn, parent.type, parent.definition_version)
        state = definition.state(fan_out.state)
        bodies = dict(definition.children(state))
        started = fanouts.inputs_txn(conn, parent_id, attempt, [c.slot for c, _ in children])
        if state.map is not None and any(t.status is MachineStatus.COMPLETED for _, t in children):
            shared = fanouts.shared_txn(conn, parent_id, attempt)
            started = {slot: {**shared, **(own or {})} for slot, own in started.items()}
        slots = [
            _slot(child, t, bodies[child.branch if state.parallel is not None else None], started)
            for child, t in children
        ]
        fanouts.end_slots_txn(conn, parent_id, attempt, slots)
        if fan_out.closed_at is not None or fan_out.verdict != Verdict.PENDING.value:
            return  # the parent moved on, or the join was decided: nothing more counts
        rule = rule_for(state, fan_out.total)
        ends = [slot.status is SlotStatus.SUCCEEDED for slot in slots]
        counted = ended_together(rule, fanouts.tally_of(fan_out), ends)
        start = counted.start
        decided_by = None if counted.decider is None else children[counted.decider][0].id
        fanouts.count_txn(
            conn, parent_id, attempt, counted.tally, writes.now if decided_by else None, decided_by
        )
        if start:
            found = fanouts.waiting_txn(conn, parent_id, attempt, fan_out.started, start)
            shared = fanouts.shared_txn(conn, parent_id, attempt) if found else {}
            waiting = [(r.slot, {**shared, **r.input}) for r in found]
            plan = self._branches(conn, parent, definition, state)
            self._start(conn, rows, parent, attempt, state, plan, waiting, writes)
        if decided_by is not None:
            self._join_now(conn, rows, parent, definition, attempt, writes)

    def _branches(
        self,
        conn: Connection,
        parent: q.AnyRow,
        definition: MachineDefinition,
        state: StateDefinition,
    ) -> list[tuple[str | None, MachineDefinition, int]]:
        """A map's one body, for the items started later (every slot runs the same)."""
        ((branch, body),) = definition.children(state)
        return [(branch, *self._definition(conn, parent, definition, state, branch, body))]

    def _join_now(
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

    def _out_of_budget(
        self, conn: Connection, rows: Rows, ancestor_id: UUID, why: str, writes: Writes
    ) -> None:
        """An ancestor's budget ran out mid fan-out: the join fails, its children still out are
        cancelled, and the ancestor takes its failure edge (where its budget pauses it)."""
        ancestor = self._row(conn, rows, ancestor_id)
        fan_out = fanouts.open_fan_out_txn(conn, ancestor_id)
        if fan_out is None or fan_out.verdict != Verdict.PENDING.value:
            return
        tally = fanouts.tally_of(fan_out)
        failed = Tally(tally.started, tally.succeeded, tally.failed, Verdict.FAILED)
        fanouts.count_txn(conn, ancestor_id, fan_out.attempt, failed, writes.now, None)
        definition = self._rt.catalog.version(conn, ancestor.type, ancestor.definition_version)
        self._join_now(conn, rows, ancestor, definition, fan_out.attempt, writes, why)

    def _row(self, conn: Connection, rows: Rows, machine_id: UUID) -> q.AnyRow:
        """A machine this transaction holds (an ancestor of one it locked, or a child)."""
        found = rows.get(machine_id)
        if found is None:
            rows.update(q.lock_machines_txn(conn, [machine_id]))
            found = rows[machine_id]
        return found


def _items(state: StateDefinition, context: Mapping[str, Any], most: int) -> list[Any]:
    """A map's list, from its parent's context, bounded."""
    assert state.map is not None
    expression = state.map.items
    try:
        items = compile_guard(expression).search({"context": context})
    except jmespath.exceptions.JMESPathError as exc:
        raise Refused(f"items {expression!r} failed: {exc}") from None
    if not isinstance(items, list):
        found = "nothing" if items is None else type(items).__name__
        raise Refused(f"items {expression!r} is not a list (got {found})")
    if len(items) > most:
        raise Refused(
            f"items {expression!r} holds {len(items)} items, over FSM_MAX_FANOUT_ITEMS={most}"
        )
    return items


def _evaluate(
    spec: str | dict[str, str] | None,
    data: Mapping[str, Any],
    *,
    default: bool,
    context: Mapping[str, Any],
) -> dict[str, Any]:
    """A child's input: its expression's object, one expression per key, or by default the
    parent's context (a map's child sees only its item unless its input says more)."""
    if spec is None:
        if not default:
            return {}
        return {k: v for k, v in context.items() if k not in (LOOP_COUNT, LOOP_LIMIT)}
    try:
        if isinstance(spec, str):
            built = compile_guard(spec).search(data)
            if not isinstance(built, dict):
                found = "nothing" if built is None else type(built).__name__
                raise Refused(f"{spec!r} must give an object, got {found}")
            return dict(built)
        return {key: compile_guard(expr).search(data) for key, expr in spec.items()}
    except jmespath.exceptions.JMESPathError as exc:
        raise Refused(f"{exc}") from None


def _size(built: Mapping[str, Any]) -> int:
    return len(json.dumps(built))


def _within(most: int, sizes: Sequence[int]) -> None:
    """Refuse a fan-out whose children's starting contexts would take more than `most` bytes
    together (each child's row holds its own; all of them are what one answer plans)."""
    total = sum(sizes)
    if total > most:
        raise TooLarge(
            f"its {len(sizes)} children's starting contexts would take {total} bytes together, "
            f"over FSM_MAX_FANOUT_BYTES={most}"
        )


def _check_schema(child: MachineDefinition, built: Mapping[str, Any], where: str) -> None:
    if child.context_schema is None:
        return
    mismatch = context_problem(child.context_schema, built)
    if mismatch is not None:
        raise Refused(f"{where}: the input does not match {child.type}'s schema: {mismatch}")


def _result(final: Mapping[str, Any], started: Mapping[str, Any], body: Body) -> dict[str, Any]:
    """What a child that completed hands its parent: the fields its body names (output:), else
    what it added to the context it started with, or changed in it."""
    if body.output is not None:
        return {key: final[key] for key in body.output if key in final}
    return {
        key: value
        for key, value in final.items()
        if key not in (LOOP_COUNT, LOOP_LIMIT) and (key not in started or started[key] != value)
    }


def _slot(child: q.AnyRow, t: Transition, body: Body, inputs: Mapping[int, Any]) -> Slot:
    """How a child ended, for its slot: what it produced, or its error."""
    if t.status is MachineStatus.COMPLETED:
        result = _result(t.context, inputs.get(child.slot) or {}, body)
        return Slot(child.slot, SlotStatus.SUCCEEDED, result)
    status = SlotStatus.FAILED if t.status is MachineStatus.FAILED else SlotStatus.CANCELLED
    return Slot(child.slot, status, None, t.error or status.value)
