"""A GitHub webhook delivery carried out: at most one machine per delivery, and none for an
issue that already has one running (fsm_celery.core.github decides what a delivery asks), nor
for one whose context the machine type refuses (its context_schema asks for more); and an
approver's `/approve` or `/reject` comment decided at the gate of the issue's machine."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core import signal
from fsm_celery.core.gate import Choice, Vote
from fsm_celery.core.github import Decision, Ignored, Outside, Trigger
from fsm_celery.core.steps import Next
from fsm_celery.engine.admin import Admin
from fsm_celery.engine.approvals import Approvals, Authority
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.signals import Signals
from fsm_celery.exceptions import (
    EventRefused,
    GateClosed,
    InvalidContext,
    InvalidDecision,
    InvalidEvent,
    NotAnApprover,
)
from fsm_celery.store import github as store
from fsm_celery.store.writes import Writes

Wanted = TypeVar("Wanted", Decision, Trigger)


@dataclass(frozen=True)
class Delivered:
    """What a delivery did: started, running (one was already), ignored, refused (its context
    does not match the machine type's schema) or duplicate."""

    outcome: str
    machine_id: UUID | None = None
    detail: str = ""
    next: Next | None = None


class GitHub:
    def __init__(self, runtime: Runtime, admin: Admin, approvals: Approvals) -> None:
        self._rt = runtime
        self._admin = admin
        self._approvals = approvals

    def comment(
        self, delivery: str, event: str, wanted: Decision | Ignored, action: str | None
    ) -> Delivered:
        """Carry out an `/approve` or `/reject` comment: the decision of the approver whose
        GitHub login wrote it, at the gate of the machine running for the issue, recorded with
        the delivery in one transaction (a delivery sent again decides nothing)."""
        return self._once(delivery, event, wanted, action, self._decide_txn)

    def _decide_txn(
        self, conn: Connection, writes: Writes, delivery: str, wanted: Decision
    ) -> Delivered:
        where = (wanted.repository, wanted.issue)
        person = self._approver(wanted.user_id)
        machine_id = store.waiting_for_issue_txn(conn, *where)
        if person is None or machine_id is None:
            why = (
                f"{wanted.login} (GitHub account {wanted.user_id}) is no approver's "
                "github_id (FSM_APPROVERS)"
                if person is None
                else f"no machine waits for people on {wanted.repository}#{wanted.issue}"
            )
            store.record_delivery_txn(conn, delivery, "ignored", *where)
            return Delivered("ignored", detail=why)
        name, groups = person
        vote = Vote(name, Choice(wanted.choice), wanted.fields, wanted.comment, "github")
        try:
            with conn.begin_nested():  # a refused decision leaves the delivery's row only
                decided = self._approvals.decide_txn(
                    conn, writes, machine_id, vote, Authority(admin=False, groups=groups)
                )
        except (GateClosed, NotAnApprover, InvalidDecision) as exc:
            store.record_delivery_txn(conn, delivery, "refused", *where, machine_id)
            return Delivered("refused", machine_id, str(exc))
        store.record_delivery_txn(conn, delivery, "decided", *where, machine_id)
        said = f"{vote.choice.value} by {name}: {decided.approvals}/{decided.needed} approvals"
        return Delivered("decided", machine_id, said, writes.next())

    def outside(
        self,
        delivery: str,
        event: str,
        wanted: Outside | Ignored,
        action: str | None,
        signals: Signals,
    ) -> Delivered:
        """Send a delivery's outside event (a merged pull request, finished checks) to each
        machine it concerns whose definition waits for it, each in a transaction of its own,
        keyed by the delivery: a redelivery, or a retry after a crash part-way, sends none of
        them twice."""
        with self._rt.db.begin() as conn:
            store.claim_delivery_txn(conn, delivery, event, action)  # recorded; keys dedupe
            if isinstance(wanted, Ignored):
                store.record_delivery_txn(conn, delivery, "ignored")
                return Delivered("ignored", detail=wanted.reason)
            if wanted.branch is not None:
                found = store.started_on_branch_txn(conn, wanted.repository, wanted.branch)
            else:
                found = store.started_for_issues_txn(conn, wanted.repository, wanted.issues)
            waiting = [
                machine_id
                for machine_id, machine_type, version in found
                if signal.waiting_for(
                    self._rt.catalog.version(conn, machine_type, version).states, wanted.name
                )
            ]
        told: list[str] = []
        next_states: Next = []
        for machine_id in waiting:
            try:
                done = signals.send(
                    machine_id,
                    wanted.name,
                    wanted.payload,
                    "github",
                    "github",
                    f"github:{delivery}",
                )
            except (EventRefused, InvalidEvent) as exc:
                told.append(f"{machine_id}: refused ({exc})")
                continue
            told.append(f"{machine_id}: {done.outcome}")
            next_states += done.next
        with self._rt.db.begin() as conn:
            outcome = "signalled" if told else "ignored"
            store.record_delivery_txn(conn, delivery, outcome, wanted.repository)
        detail = "; ".join(told) or f"no machine here waits for {wanted.name}"
        return Delivered(outcome, detail=detail, next=next_states)

    def _approver(self, user_id: int) -> tuple[str, frozenset[str]] | None:
        """The approver (name, groups) whose GitHub account it is, by its numeric id: a login
        can be renamed, and then registered by someone else."""
        for name, approver in self._rt.settings.approvers.items():
            if approver.github_id is not None and approver.github_id == user_id:
                return name, frozenset(approver.groups)
        return None

    def deliver(
        self, delivery: str, event: str, wanted: Trigger | Ignored, action: str | None
    ) -> Delivered:
        """Record the delivery and start what it asks for, in one transaction: a delivery
        GitHub sends again finds its row and starts nothing."""
        return self._once(delivery, event, wanted, action, self._start_txn)

    def _start_txn(
        self, conn: Connection, writes: Writes, delivery: str, wanted: Trigger
    ) -> Delivered:
        """Start the machine the delivery asks for, keyed `github:<delivery id>`: the delivery's
        row dedupes the webhook; the key shows on the machine which delivery started it, and a
        start given that key finds the machine."""
        key = f"github:{delivery}"
        store.lock_issue_txn(conn, wanted.repository, wanted.issue)
        running = store.running_for_issue_txn(
            conn, wanted.machine_type, wanted.repository, wanted.issue
        )
        if running is not None:
            store.record_delivery_txn(
                conn, delivery, "running", wanted.repository, wanted.issue, running
            )
            return Delivered("running", running, f"{wanted.machine_type} runs for it")
        try:  # refused before anything of the machine is written
            started = self._admin.start_txn(
                conn, writes, wanted.machine_type, wanted.context, None, wanted.issue, key
            )
        except InvalidContext as exc:
            store.record_delivery_txn(conn, delivery, "refused", wanted.repository, wanted.issue)
            return Delivered("refused", detail=str(exc))
        mid = started.machine_id
        store.record_delivery_txn(conn, delivery, "started", wanted.repository, wanted.issue, mid)
        return Delivered("started", mid, wanted.machine_type, started.next)

    def _once(
        self,
        delivery: str,
        event: str,
        wanted: Wanted | Ignored,
        action: str | None,
        carry_out: Callable[[Connection, Writes, str, Wanted], Delivered],
    ) -> Delivered:
        """Record the delivery and carry out what it asks for in the same transaction: one
        GitHub sends again, or one that asks nothing, is settled by its row alone."""
        writes = Writes(self._rt.clock())
        with self._rt.transaction(writes) as conn:
            done = _claimed(conn, delivery, event, wanted, action)
            if done is not None:
                return done
            assert not isinstance(wanted, Ignored)
            return carry_out(conn, writes, delivery, wanted)


def _claimed(
    conn: Connection, delivery: str, event: str, wanted: object, action: str | None
) -> Delivered | None:
    """Record the delivery; what it did already when it is a duplicate or asks nothing (its
    row settled), else None: the caller carries it out in the same transaction."""
    if not store.claim_delivery_txn(conn, delivery, event, action):
        return Delivered("duplicate", detail=f"delivery {delivery} was received before")
    if isinstance(wanted, Ignored):
        store.record_delivery_txn(conn, delivery, "ignored")
        return Delivered("ignored", detail=wanted.reason)
    return None
