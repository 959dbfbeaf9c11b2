"""Outgoing notifications when a machine ends (the seed's "notify CEO"), pure: where they go,
what they say, how they are signed, and how long to wait before trying one again.

A notification is written with the transition that ended the machine (an outbox row), and sent
by beat's job afterwards: a receiver that is down or slow never holds a transition back.
Receivers check `X-FSM-Signature-256: sha256=<HMAC-SHA256 of the body under FSM_NOTIFY_SECRET>`,
as GitHub's webhooks are checked, and may see one twice (at least once): `X-FSM-Delivery` names it.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime, timedelta
from typing import Any
from uuid import UUID

from fsm_celery.core.definition import Backoff, Jitter, Notify
from fsm_celery.core.retry import retry_delay

ENDED = ("completed", "failed", "cancelled")
APPROVAL = "approval"  # a machine waits for people at an approval gate (fsm_celery.core.gate)
EVENTS = (*ENDED, APPROVAL)
BACKOFF = Backoff(
    delay=timedelta(seconds=5), rate=2.0, max_delay=timedelta(hours=1), jitter=Jitter.FULL
)
ERROR_CHARS = 1000


def targets(notify: Notify | None, default_url: str, status: str) -> list[str]:
    """The URLs a machine ending with this status (or waiting at an approval gate: APPROVAL)
    notifies: its definition's (for the events it names) and the global one, each once."""
    if status not in EVENTS:
        return []
    urls = []
    if notify is not None and status in notify.on:
        urls.append(notify.url)
    if default_url and default_url not in urls:
        urls.append(default_url)
    return urls


def payload(
    *,
    machine_id: UUID,
    machine_type: str,
    status: str,
    state: str,
    attempt: int,
    error: str | None,
    github_issue: int | None,
    context: dict[str, Any],
    at: datetime,
) -> dict[str, Any]:
    """The body of a notification (camelCase, as the wire protocol)."""
    return {
        "type": "machine_ended",
        "machineId": str(machine_id),
        "machineType": machine_type,
        "status": status,
        "state": state,
        "attempt": attempt,
        "error": error[:ERROR_CHARS] if error else None,
        "githubIssue": github_issue,
        "context": context,
        "at": at.isoformat(),
    }


def approval_payload(
    *,
    machine_id: UUID,
    machine_type: str,
    state: str,
    attempt: int,
    approvers: list[str],
    deadline: datetime,
    github_issue: int | None,
    decide_url: str | None,
    at: datetime,
) -> dict[str, Any]:
    """The body of a notification that people are waited for at an approval gate."""
    return {
        "type": "approval_waiting",
        "machineId": str(machine_id),
        "machineType": machine_type,
        "state": state,
        "attempt": attempt,
        "approvers": approvers,
        "deadline": deadline.isoformat(),
        "githubIssue": github_issue,
        "decideUrl": decide_url,
        "at": at.isoformat(),
    }


def body(message: dict[str, Any]) -> bytes:
    return json.dumps(message, separators=(",", ":"), sort_keys=True).encode()


def signature(secret: str, data: bytes) -> str:
    """The X-FSM-Signature-256 header of a body."""
    return "sha256=" + hmac.new(secret.encode(), data, hashlib.sha256).hexdigest()


def retry_after(attempts: int, unit: float) -> float:
    """Seconds before the next try of a notification tried `attempts` times (jittered by unit
    in [0, 1): 5 s, 10 s, 20 s … an hour at most)."""
    return max(1.0, retry_delay(BACKOFF, attempts, unit))
