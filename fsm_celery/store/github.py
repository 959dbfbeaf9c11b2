"""The GitHub webhook's rows: each delivery seen once, and the machines running for an issue.
Each helper takes the connection and never commits."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from sqlalchemy import ColumnElement, Connection, select, update

from fsm_celery.store import dialects
from fsm_celery.store.tables import approval_gates, github_deliveries, machines

UNFINISHED = ("running", "paused")


def claim_delivery_txn(conn: Connection, delivery: str, event: str, action: str | None) -> bool:
    """Record the delivery; False when it was recorded already (GitHub sent it again)."""
    statement = (
        dialects.of(conn)
        .insert(github_deliveries)
        .values(id=delivery, event=event[:50], action=(action or "")[:50], outcome="received")
        .on_conflict_do_nothing()
    )
    return conn.execute(statement).rowcount == 1


def record_delivery_txn(
    conn: Connection,
    delivery: str,
    outcome: str,
    repository: str | None = None,
    issue: int | None = None,
    machine_id: UUID | None = None,
) -> None:
    conn.execute(
        update(github_deliveries)
        .where(github_deliveries.c.id == delivery)
        .values(outcome=outcome, repository=repository, issue=issue, machine_id=machine_id)
    )


def lock_issue_txn(conn: Connection, repository: str, issue: int) -> None:
    """Take the issue's lock: two deliveries for one issue start at most one machine."""
    dialects.of(conn).lock_key(conn, f"github:{repository}#{issue}")


def running_for_issue_txn(
    conn: Connection, machine_type: str, repository: str, issue: int
) -> UUID | None:
    """An unfinished machine of the type that a delivery started for the repository's issue.

    Found through the delivery's row, not the machine's context: agents' outputs merge into the
    context and may well say `repository` too.
    """
    found: UUID | None = conn.execute(
        select(machines.c.id)
        .select_from(
            github_deliveries.join(machines, machines.c.id == github_deliveries.c.machine_id)
        )
        .where(
            github_deliveries.c.repository == repository,
            github_deliveries.c.issue == issue,
            machines.c.type == machine_type,
            machines.c.status.in_(UNFINISHED),
        )
        .limit(1)
    ).scalar()
    return found


def waiting_for_issue_txn(conn: Connection, repository: str, issue: int) -> UUID | None:
    """A running machine a delivery started for the repository's issue that waits at an
    approval gate (the oldest, if several do)."""
    found: UUID | None = conn.execute(
        select(machines.c.id)
        .select_from(
            github_deliveries.join(machines, machines.c.id == github_deliveries.c.machine_id).join(
                approval_gates,
                (approval_gates.c.machine_id == machines.c.id)
                & approval_gates.c.closed_at.is_(None)
                & (approval_gates.c.attempt == machines.c.attempt),
            )
        )
        .where(
            github_deliveries.c.repository == repository,
            github_deliveries.c.issue == issue,
            machines.c.status == "running",
        )
        .order_by(approval_gates.c.opened_at)
        .limit(1)
    ).scalar()
    return found


def started_for_issues_txn(
    conn: Connection, repository: str, issues: Sequence[int]
) -> list[tuple[UUID, str, int]]:
    """The unfinished machines (id, type, definition version) deliveries started for the
    repository's issues."""
    return _started(conn, repository, github_deliveries.c.issue.in_(list(issues)))


def started_on_branch_txn(
    conn: Connection, repository: str, branch: str
) -> list[tuple[UUID, str, int]]:
    """The unfinished machines (id, type, definition version) deliveries started in the
    repository whose context's `branch` is the branch (the agent that pushed it put it
    there)."""
    return _started(conn, repository, machines.c.context["branch"].as_string() == branch)


def _started(
    conn: Connection, repository: str, which: ColumnElement[bool]
) -> list[tuple[UUID, str, int]]:
    rows = conn.execute(
        select(machines.c.id, machines.c.type, machines.c.definition_version)
        .select_from(
            github_deliveries.join(machines, machines.c.id == github_deliveries.c.machine_id)
        )
        .where(
            github_deliveries.c.repository == repository,
            machines.c.status.in_(UNFINISHED),
            which,
        )
        .order_by(machines.c.created_at)
    ).all()
    return list(dict.fromkeys((r.id, r.type, r.definition_version) for r in rows))
