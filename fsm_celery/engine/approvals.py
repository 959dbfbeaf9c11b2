"""People's decisions at approval gates: each recorded, and the gate's decisions counted, in
one transaction with the machine's row locked, so a quorum moves the machine exactly once,
whichever doors (the dashboard, the API, the CLI, the client, GitHub) the decisions came
through at once. The counting is fsm_celery.core.gate's; the move, fsm_celery.core.transition's;
opening a gate, fsm_celery.engine.gates'.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core import gate
from fsm_celery.core.definition import StateDefinition
from fsm_celery.core.gate import Approval, Verdict, Vote
from fsm_celery.core.messages import json_problem, unstorable
from fsm_celery.core.transition import GateDecided, MachineStatus, Rejected, decide
from fsm_celery.engine.entry import Entry
from fsm_celery.engine.ports import Next
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.writes import Writes, snapshot
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


@dataclass(frozen=True)
class Authority:
    """Who decides: an admin (at any gate), or a member of these approver groups."""

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
    next: Next = field(default_factory=list)


class Approvals:
    def __init__(self, runtime: Runtime, entry: Entry) -> None:
        self._rt = runtime
        self._entry = entry

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
        writes everything the transaction did, so the caller writes nothing after it."""
        _check_vote(machine_id, vote, self._rt.settings.max_payload_bytes)
        rows = q.lock_machines_txn(conn, [machine_id], ancestors=True)
        row = rows.get(machine_id)
        if row is None:
            raise MachineNotFound(str(machine_id))
        definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        state = definition.state(row.current_state)
        opened = store.open_gate_txn(conn, machine_id)
        _check_open(row, state, opened, attempt)
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
            created_at=writes.now,
        )
        decisions = store.decisions_txn(conn, opened.id)
        mine = next(d for d in decisions if d.actor == vote.actor)
        members = len(gate.members_of(self._rt.settings.approver_groups, approval))
        approvals = sum(d.decision == gate.APPROVE for d in decisions)
        count = gate.count(approval, members, approvals, len(decisions) - approvals)
        closed = recorded and count.verdict is not Verdict.PENDING
        store.update_txn(
            conn,
            opened.id,
            approvals=count.approvals,
            rejections=count.rejections,
            needed=count.needed,
            **({"verdict": count.verdict.value, "closed_at": writes.now} if closed else {}),
        )
        moved_to = None
        if closed:
            votes = [(d.actor, d.decision, d.comment) for d in decisions]
            output = {**mine.fields, **gate.summary(count.verdict, votes)}
            approved = count.verdict is Verdict.APPROVED
            event = GateDecided(state.name, row.attempt, approved, output)
            decision = decide(definition, snapshot(row), event, self._rt.limits)
            if isinstance(decision, Rejected):  # a guard on the fields, the context's size
                raise InvalidDecision(str(machine_id), decision.detail)
            try:
                writes.transition(
                    row, decision, "approval", actor=vote.actor, reason=vote.comment or None
                )
            except Unstorable as exc:
                raise InvalidDecision(str(machine_id), exc.detail) from exc
            moved_to = decision.to_state
            self._entry.enter_due_txn(conn, rows, writes)
            self._entry.send_and_write(conn, writes)
        return Decided(
            machine_id=machine_id,
            state=state.name,
            attempt=row.attempt,
            recorded=recorded,
            decision=mine.decision,
            approvals=count.approvals,
            rejections=count.rejections,
            needed=count.needed,
            verdict=count.verdict.value if recorded else Verdict.PENDING.value,
            moved_to=moved_to,
        )


def _check_vote(machine_id: UUID, vote: Vote, max_bytes: int) -> None:
    """Refuse a decision too large, or holding what cannot be stored, before any lock."""
    if not vote.actor or len(vote.actor) > gate.ACTOR_CHARS:
        raise InvalidDecision(str(machine_id), f"actor must be 1 to {gate.ACTOR_CHARS} characters")
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
