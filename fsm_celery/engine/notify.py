"""Notifications when machines end: written with the transition that ended them (`outbox_txn`),
sent afterwards by beat's job (`Notifier.deliver`), retried with backoff, and failed for good,
with the receiver's last answer, after FSM_NOTIFY_MAX_ATTEMPTS tries.

A try takes its notifications under a lease (their next try pushed past the send's timeout), in
a transaction of its own, then sends them, then records what happened: no row lock is held
while a receiver answers, and a job killed mid-send leaves them to the next one.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from sqlalchemy import Connection

from fsm_celery.core import notify
from fsm_celery.core.retry import jitter_unit
from fsm_celery.engine.ports import Poster, Webhook
from fsm_celery.engine.runtime import Runtime
from fsm_celery.store import notify as store
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.writes import ENDED, Writes

log = logging.getLogger(__name__)
NO_SECRET = "FSM_NOTIFY_SECRET is not set: notifications are sent signed only"


def outbox_txn(conn: Connection, runtime: Runtime, writes: Writes) -> None:
    """Queue a notification for each machine the transaction ended, where its definition or
    FSM_NOTIFY_URL asks for one."""
    ended = [(row, t) for row, t, _ in writes.log if t.status in ENDED]
    if not ended:
        return
    rows = []
    for row, t in ended:
        definition = runtime.catalog.version(conn, row.type, row.definition_version)
        urls = notify.targets(definition.notify, runtime.settings.notify_url, t.status.value)
        if not urls:
            continue
        message = notify.payload(
            machine_id=row.id,
            machine_type=row.type,
            status=t.status.value,
            state=t.to_state,
            attempt=row.attempt,
            error=t.error,
            github_issue=row.github_issue,
            context=dict(t.context),
            at=writes.now,
        )
        rows += [
            {
                "machine_id": row.id,
                "url": url,
                "event": t.status.value,
                "payload": message,
                "next_attempt_at": writes.now,
            }
            for url in urls
        ]
    store.insert_notifications_txn(conn, rows)


class Notifier:
    def __init__(self, runtime: Runtime, post: Poster) -> None:
        self._rt = runtime
        self._post = post  # the HTTP side (fsm_celery.channel.webhook)

    def send_due(self, limit: int = 50) -> tuple[int, int]:
        """Send the notifications due now; how many were delivered and how many failed."""
        settings = self._rt.settings
        now = self._rt.clock()
        lease = timedelta(seconds=2 * settings.notify_timeout_seconds + 5)
        with self._rt.db.begin() as conn:
            due = store.claim_due_txn(conn, now, limit, lease)
        if not due:
            return 0, 0
        secret = settings.notify_secret
        if secret:
            errors = self._post(
                [_webhook(row, secret) for row in due], settings.notify_timeout_seconds
            )
        else:
            errors = [NO_SECRET] * len(due)
        done = self._rt.clock()
        delivered = 0
        with self._rt.db.begin() as conn:
            for row, error in zip(due, errors, strict=True):
                delivered += error is None
                store.record_try_txn(conn, row.id, **self._outcome(row, error, done))
        return delivered, len(due) - delivered

    def _outcome(self, row: AnyRow, error: str | None, now: datetime) -> dict[str, object]:
        tries = row.attempts + 1
        if error is None:
            return {"status": "delivered", "delivered_at": now, "last_error": None}
        if tries >= self._rt.settings.notify_max_attempts:
            log.warning("notification %s to %s failed for good: %s", row.id, row.url, error)
            return {"status": "failed", "last_error": error}
        delay = notify.retry_after(tries, jitter_unit(row.machine_id, int(row.id) * 100 + tries))
        return {"last_error": error, "next_attempt_at": now + timedelta(seconds=delay)}


def _webhook(row: AnyRow, secret: str) -> Webhook:
    """One notification, signed."""
    data = notify.body(row.payload)
    headers = {
        "content-type": "application/json",
        "user-agent": "fsm-celery",
        "x-fsm-event": f"machine.{row.event}",
        "x-fsm-delivery": str(row.id),
        "x-fsm-signature-256": notify.signature(secret, data),
    }
    return Webhook(row.url, data, headers)
