"""The notification outbox's rows. Each helper takes the connection and never commits."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from sqlalchemy import Connection, insert, select, update

from fsm_celery.store.queries import AnyRow
from fsm_celery.store.tables import notifications


def insert_notifications_txn(conn: Connection, rows: Sequence[dict[str, Any]]) -> None:
    """Queue notifications (machine_id, url, event, payload, next_attempt_at)."""
    if rows:
        conn.execute(insert(notifications), [{"status": "pending", **r} for r in rows])


def claim_due_txn(
    conn: Connection, now: datetime, limit: int, lease: timedelta
) -> Sequence[AnyRow]:
    """Take the due notifications (skipping those another job holds) and push their next try
    past the lease, so that a job that dies mid-send leaves them to be tried again."""
    rows = conn.execute(
        select(notifications)
        .where(notifications.c.status == "pending", notifications.c.next_attempt_at <= now)
        .order_by(notifications.c.next_attempt_at)
        .limit(limit)
        .with_for_update(skip_locked=True)
    ).all()
    if rows:
        conn.execute(
            update(notifications)
            .where(notifications.c.id.in_([r.id for r in rows]))
            .values(
                attempts=notifications.c.attempts + 1,
                next_attempt_at=now + lease,
            )
        )
    return rows


def record_try_txn(conn: Connection, notification_id: int, **fields: Any) -> None:
    """Record a try's outcome: delivered, failed for good, or the time of the next try."""
    conn.execute(
        update(notifications).where(notifications.c.id == notification_id).values(**fields)
    )


def of_machine_txn(conn: Connection, machine_id: UUID) -> Sequence[AnyRow]:
    return conn.execute(
        select(
            notifications.c.id,
            notifications.c.url,
            notifications.c.event,
            notifications.c.status,
            notifications.c.attempts,
            notifications.c.next_attempt_at,
            notifications.c.last_error,
            notifications.c.created_at,
            notifications.c.delivered_at,
        )
        .where(notifications.c.machine_id == machine_id)
        .order_by(notifications.c.id)
    ).all()
