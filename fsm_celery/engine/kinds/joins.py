"""What a transaction's transitions mean for fan-outs, carried out in it (a hook of every
transaction that moves machines, run until nothing more is to settle): a child's end is
counted in its parent's fan-out, the parent's row being locked already (the store locks a
machine's ancestors with it), and when that decides the join the losers are cancelled and the
parent moves on, here; a map's next items start in the slots freed; a parent paused, resumed
or moved off its fan-out state takes its children along (to every depth); and children's
spending counts against every ancestor's budget (docs/fan-out.md)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core.definition import Body
from fsm_celery.core.join import Slot, SlotStatus, Tally, Verdict, ended_together, rule_for
from fsm_celery.core.transition import LOOP_COUNT, LOOP_LIMIT, MachineStatus, Transition
from fsm_celery.core.usage import NOTHING, Usage
from fsm_celery.engine.kinds.fanout import FanOut
from fsm_celery.engine.runtime import Runtime
from fsm_celery.store import fanouts
from fsm_celery.store import queries as q
from fsm_celery.store.writes import ENDED, Rows, Writes


@dataclass
class Progress:
    """A transaction's part (Writes.parts): how many of its transitions fan-outs have settled,
    and its children's spending rolled up, per ancestor."""

    settled: int = 0
    rolled_up: dict[UUID, Usage] = field(default_factory=dict)

    def write(self, conn: Connection, writes: Writes) -> None:
        spent = {mid: u for mid, u in self.rolled_up.items() if mid not in writes.moves}
        fanouts.add_usage_txn(conn, spent)  # a moved machine's Move holds its new totals


class Joins:
    """Settles fan-outs in a transaction (its Progress)."""

    def __init__(self, runtime: Runtime, fanout: FanOut) -> None:
        self._rt = runtime
        self._fanout = fanout

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
        progress = _progress(writes)
        while progress.settled < len(writes.log) or ended or over_budget:
            batch = writes.log[progress.settled :]
            progress.settled = len(writes.log)
            for row, t, event in batch:
                if row.parent_id is not None:
                    if t.usage.tokens or t.usage.cost:
                        over_budget |= self._roll_up(conn, rows, row, t, writes)
                    if t.status in ENDED:
                        ended.setdefault((row.parent_id, row.parent_attempt), []).append((row, t))
                if event != "join" and self._left_fan_out(conn, row, t):
                    self._fanout.leave_txn(conn, rows, row, t, event, writes)
            if ended:
                self._settle_deepest(conn, rows, ended, writes)
            elif over_budget:  # the deepest first: the end its join makes counts in the next
                ancestor = max(over_budget, key=lambda a: self._fanout.row(conn, rows, a).depth)
                self._out_of_budget(conn, rows, ancestor, over_budget.pop(ancestor), writes)

    def _left_fan_out(self, conn: Connection, row: q.AnyRow, t: Transition) -> bool:
        """Whether the transition moved the machine from (or paused, or resumed it at) a
        fan-out state."""
        key = (row.type, row.definition_version)  # parsed already, nearly always: read
        definition = self._rt.catalog.parsed.get(key) or self._rt.catalog.version(conn, *key)
        return definition.state(t.from_state).fans_out

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
        progress = _progress(writes)
        over: dict[UUID, str] = {}
        ancestor_id = row.parent_id
        while ancestor_id is not None:
            ancestor = self._fanout.row(conn, rows, ancestor_id)
            writes.roll_up(ancestor, t.usage)
            rolled = progress.rolled_up
            rolled[ancestor_id] = rolled.get(ancestor_id, NOTHING).rolled(t.usage)
            machine = writes.machine(ancestor)
            exceeded = machine.budget.exceeded_by(machine.usage)
            if exceeded is not None and machine.status is MachineStatus.RUNNING:
                over[ancestor_id] = exceeded
            ancestor_id = ancestor.parent_id
        return over

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
        parent = self._fanout.row(conn, rows, parent_id)
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
            plan = self._fanout.planner.branches(conn, parent, definition, state)
            self._fanout.start(conn, rows, parent, attempt, state, plan, waiting, writes)
        if decided_by is not None:
            self._fanout.join_now(conn, rows, parent, definition, attempt, writes)

    def _out_of_budget(
        self, conn: Connection, rows: Rows, ancestor_id: UUID, why: str, writes: Writes
    ) -> None:
        """An ancestor's budget ran out mid fan-out: the join fails, its children still out are
        cancelled, and the ancestor takes its failure edge (where its budget pauses it)."""
        ancestor = self._fanout.row(conn, rows, ancestor_id)
        fan_out = fanouts.open_fan_out_txn(conn, ancestor_id)
        if fan_out is None or fan_out.verdict != Verdict.PENDING.value:
            return
        tally = fanouts.tally_of(fan_out)
        failed = Tally(tally.started, tally.succeeded, tally.failed, Verdict.FAILED)
        fanouts.count_txn(conn, ancestor_id, fan_out.attempt, failed, writes.now, None)
        definition = self._rt.catalog.version(conn, ancestor.type, ancestor.definition_version)
        self._fanout.join_now(conn, rows, ancestor, definition, fan_out.attempt, writes, why)


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


def _progress(writes: Writes) -> Progress:
    """The transaction's Progress (made now, the first time): its part of Writes.parts."""
    found = writes.parts.get(Progress)
    if found is None:
        found = writes.parts[Progress] = Progress()
    return found
