"""A GitHub webhook delivery carried out: at most one machine per delivery, and none for an
issue that already has one running (fsm_celery.core.github decides what a delivery asks), nor
for one whose context the machine type refuses (its context_schema asks for more)."""

from __future__ import annotations

from dataclasses import dataclass
from uuid import UUID

from fsm_celery.core.github import Ignored, Trigger
from fsm_celery.engine.admin import Admin
from fsm_celery.engine.ports import Next
from fsm_celery.engine.runtime import Runtime
from fsm_celery.engine.writes import Writes
from fsm_celery.exceptions import InvalidContext
from fsm_celery.store import github as store


@dataclass(frozen=True)
class Delivered:
    """What a delivery did: started, running (one was already), ignored, refused (its context
    does not match the machine type's schema) or duplicate."""

    outcome: str
    machine_id: UUID | None = None
    detail: str = ""
    next: Next | None = None


class GitHub:
    def __init__(self, runtime: Runtime, admin: Admin) -> None:
        self._rt = runtime
        self._admin = admin

    def deliver(
        self, delivery: str, event: str, wanted: Trigger | Ignored, action: str | None
    ) -> Delivered:
        """Record the delivery and start what it asks for, in one transaction: a delivery
        GitHub sends again finds its row and starts nothing."""
        writes = Writes(self._rt.clock())
        with self._rt.transaction(writes) as conn:
            if not store.claim_delivery_txn(conn, delivery, event, action):
                return Delivered("duplicate", detail=f"delivery {delivery} was received before")
            if isinstance(wanted, Ignored):
                store.settle_delivery_txn(conn, delivery, "ignored")
                return Delivered("ignored", detail=wanted.reason)
            store.lock_issue_txn(conn, wanted.repository, wanted.issue)
            running = store.running_for_issue_txn(
                conn, wanted.machine_type, wanted.repository, wanted.issue
            )
            if running is not None:
                store.settle_delivery_txn(
                    conn, delivery, "running", wanted.repository, wanted.issue, running
                )
                return Delivered("running", running, f"{wanted.machine_type} runs for it")
            try:  # refused before anything of the machine is written
                step = self._admin.start_txn(
                    conn, writes, wanted.machine_type, wanted.context, None, wanted.issue
                )
            except InvalidContext as exc:
                store.settle_delivery_txn(
                    conn, delivery, "refused", wanted.repository, wanted.issue
                )
                return Delivered("refused", detail=str(exc))
            store.settle_delivery_txn(
                conn, delivery, "started", wanted.repository, wanted.issue, step.machine_id
            )
        return Delivered("started", step.machine_id, wanted.machine_type, [step])
