"""People's decisions at approval gates: each recorded, and the gate's decisions counted, in
one transaction with the machine's row locked, so a quorum moves the machine exactly once,
whichever doors (the dashboard, the API, the CLI, the client, GitHub) the decisions came
through at once. The counting is fsm_celery.core.gate's; the move, fsm_celery.core.transition's;
opening a gate, fsm_celery.engine.kinds.approval's.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core import gate
from fsm_celery.core.attempt_events import GateDecided
from fsm_celery.core.definition import StateDefinition
from fsm_celery.core.gate import Approval, Choice, Verdict, Vote
from fsm_celery.core.messages import json_problem, unstorable
from fsm_celery.core.steps import Next
from fsm_celery.core.timeline import ACTOR_CHARS
from fsm_celery.core.transition import MachineStatus, Rejected, decide
from fsm_celery.engine.usecase import MovingUseCase
from fsm_celery.exceptions import (
    GateClosed,
    InvalidDecision,
    MachineNotFound,
    NotAnApprover,
    Unstorable,
)
from fsm_celery.store import gates as store
from fsm_celery.store import queries as q
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.writes import Rows, Writes, snapshot


@dataclass(frozen=True)
class Authority:
    """Who decides: an admin (at any gate, by an override: the gate decided outright, as
    nobody's vote), or a member of these approver groups (one vote, as their own name)."""

    admin: bool
    groups: frozenset[str] = frozenset()

    def may_decide(self, approval: Approval) -> bool:
        return self.admin or not self.groups.isdisjoint(approval.approvers)


ADMIN = Authority(admin=True)


@dataclass(frozen=True)
class Decided:
    """What a decision did: recorded (or the person's earlier one stands), the gate's count,
    and where the machine went if it closed the gate."""

    machine_id: UUID
    state: str
    attempt: int
    recorded: bool
    decision: str  # the person's decision at the gate (their first, if they sent two)
    approvals: int
    rejections: int
    needed: int
    verdict: str
    moved_to: str | None = None
    override: bool = False  # an admin's (or the CLI's) decision: the gate decided outright
    next: Next = field(default_factory=list)


class Approvals(MovingUseCase):
    def decide(
        self,
        machine_id: UUID,
        vote: Vote,
        authority: Authority = ADMIN,
        attempt: int | None = None,
    ) -> Decided:
        """Record a person's decision at the machine's open gate and count the gate's
        decisions; a verdict moves the machine on, in the same transaction. `attempt`, when
        given, is the gate's the person saw: a decision made on a page of an earlier visit to
        the state is refused, not counted at a later one."""
        writes = Writes(self._rt.clock())
        with self._rt.transaction(writes) as conn:
            decided = self.decide_txn(conn, writes, machine_id, vote, authority, attempt)
        return replace(decided, next=writes.next())

    def decide_txn(
        self,
        conn: Connection,
        writes: Writes,
        machine_id: UUID,
        vote: Vote,
        authority: Authority = ADMIN,
        attempt: int | None = None,
    ) -> Decided:
        """decide, in the caller's transaction (a GitHub delivery is recorded in the same); it
        writes everything the transaction did, so the caller writes nothing after it. An
        approver's decision is their vote; an admin's is an override (see Authority)."""
        _check_vote(machine_id, vote, self._rt.settings.max_payload_bytes)
        rows = q.lock_machines_txn(conn, [machine_id], ancestors=True)
        row = rows.get(machine_id)
        if row is None:
            raise MachineNotFound(str(machine_id))
        definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        state = definition.state(row.current_state)
        opened = store.open_gate_txn(conn, machine_id)
        try:
            _check_open(row, state, opened, attempt)
        except GateClosed:
            repeated = _repeated_txn(conn, row, vote, attempt)
            if repeated is None:
                raise
            return repeated
        assert state.approval is not None and opened is not None  # _check_open
        approval = state.approval
        if not authority.may_decide(approval):
            raise NotAnApprover(vote.actor, state.name, approval.approvers)
        problem = gate.fields_problem(approval, vote)
        if problem is not None:
            raise InvalidDecision(str(machine_id), problem)
        recorded = store.record_txn(
            conn,
            opened.id,
            machine_id,
            actor=vote.actor,
            decision=vote.choice.value,
            fields=dict(vote.fields),
            comment=vote.comment,
            via=vote.via,
            override=authority.admin,
            created_at=writes.now,
        )
        decisions = store.decisions_txn(conn, opened.id)
        mine = next(d for d in decisions if d.actor == vote.actor)
        count = self._count(approval, decisions)
        verdict = gate.overridden(Choice(mine.decision)) if mine.override else count.verdict
        closed = recorded and verdict is not Verdict.PENDING
        store.update_txn(
            conn,
            opened.id,
            approvals=count.approvals,
            rejections=count.rejections,
            needed=count.needed,
            **({"verdict": verdict.value, "closed_at": writes.now} if closed else {}),
        )
        moved_to = None
        if closed:
            moved_to = self._close_txn(conn, writes, rows, row, state, decisions, mine, verdict)
        return Decided(
            machine_id=machine_id,
            state=state.name,
            attempt=row.attempt,
            recorded=recorded,
            decision=mine.decision,
            approvals=count.approvals,
            rejections=count.rejections,
            needed=count.needed,
            verdict=verdict.value if recorded else Verdict.PENDING.value,
            moved_to=moved_to,
            override=mine.override,
        )

    def _count(self, approval: Approval, decisions: Sequence[AnyRow]) -> gate.Count:
        """The gate's votes: its approvers' decisions, one per authenticated name (an
        override is nobody's vote)."""
        votes = [d for d in decisions if not d.override]
        members = len(gate.members_of(self._rt.settings.approver_groups, approval))
        approvals = sum(d.decision == gate.APPROVE for d in votes)
        return gate.count(approval, members, approvals, len(votes) - approvals)

    def _close_txn(
        self,
        conn: Connection,
        writes: Writes,
        rows: Rows,
        row: AnyRow,
        state: StateDefinition,
        decisions: Sequence[AnyRow],
        closing: AnyRow,
        verdict: Verdict,
    ) -> str:
        """Move the machine on from its closed gate; the state it moved to."""
        assert state.approval is not None
        machine_id = str(row.id)
        votes = [(d.actor, d.decision, d.comment, d.override) for d in decisions]
        fields = gate.declared(state.approval, closing.fields)
        output = {**fields, **gate.summary(verdict, votes)}
        event = GateDecided(state.name, row.attempt, verdict is Verdict.APPROVED, output)
        definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        decision = decide(definition, snapshot(row), event, self._rt.limits)
        if isinstance(decision, Rejected):  # a guard on the fields, the context's size
            raise InvalidDecision(machine_id, decision.detail)
        reason = closing.comment or None
        if closing.override:
            why = f"override by {closing.actor}"
            reason = f"{why}: {closing.comment}" if closing.comment else why
        try:
            writes.transition(row, decision, "approval", actor=closing.actor, reason=reason)
        except Unstorable as exc:
            raise InvalidDecision(machine_id, exc.detail) from exc
        self._entry.enter_due_txn(conn, rows, writes)
        self._entry.send_and_write(conn, writes)
        return decision.to_state


def _repeated_txn(conn: Connection, row: AnyRow, vote: Vote, attempt: int | None) -> Decided | None:
    """The person's own decision that closed the machine's latest gate, when this vote
    repeats it (a client that lost the reply learns that it closed the gate), else None."""
    gates = store.machine_gates_txn(conn, row.id)
    if not gates or gates[-1].verdict not in (Verdict.APPROVED, Verdict.REJECTED):
        return None
    closed = gates[-1]
    decisions = store.decisions_txn(conn, closed.id)
    last = decisions[-1] if decisions else None
    if last is None or (last.actor, last.decision) != (vote.actor, vote.choice.value):
        return None
    if attempt is not None and attempt != closed.attempt:
        return None
    return Decided(
        machine_id=row.id,
        state=closed.state,
        attempt=closed.attempt,
        recorded=False,
        decision=last.decision,
        approvals=closed.approvals,
        rejections=closed.rejections,
        needed=closed.needed,
        verdict=closed.verdict,
        override=last.override,
    )


def _check_vote(machine_id: UUID, vote: Vote, max_bytes: int) -> None:
    """Refuse a decision too large, or holding what cannot be stored, before any lock."""
    if not vote.actor or len(vote.actor) > ACTOR_CHARS:
        raise InvalidDecision(str(machine_id), f"actor must be 1 to {ACTOR_CHARS} characters")
    if len(vote.comment) > gate.COMMENT_CHARS:
        raise InvalidDecision(
            str(machine_id),
            f"comment is {len(vote.comment)} characters long, over {gate.COMMENT_CHARS}",
        )
    problem = unstorable({"actor": vote.actor, "comment": vote.comment}, "decision")
    problem = problem or json_problem(
        dict(vote.fields), "fields", min(gate.MAX_FIELDS_BYTES, max_bytes)
    )
    if problem is not None:
        raise InvalidDecision(str(machine_id), problem)


def _check_open(
    row: AnyRow, state: StateDefinition, opened: AnyRow | None, attempt: int | None
) -> None:
    """Refuse a decision for a gate that is not open now, saying where the machine is."""
    machine_id = str(row.id)
    if state.approval is None:
        raise GateClosed(machine_id, f"the machine is in {state.name}, which no person decides")
    if row.status != MachineStatus.RUNNING.value:
        raise GateClosed(machine_id, f"the machine is {row.status}: resume it to decide")
    if opened is None or opened.state != state.name or opened.attempt != row.attempt:
        raise GateClosed(machine_id, f"the gate at {state.name} is not open (yet)")
    if attempt is not None and attempt != row.attempt:
        raise GateClosed(
            machine_id,
            f"that gate (attempt {attempt}) closed; the machine is at {state.name} again, "
            f"attempt {row.attempt}: decide there",
        )
