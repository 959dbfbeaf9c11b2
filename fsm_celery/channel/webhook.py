"""Webhooks sent over HTTP (the engine's notifications, engine.notify): each POSTed to its
receiver, several at once, no redirect followed; for each, None when the receiver took it (a
2xx answer), else what went wrong, with the start of the receiver's answer."""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor

import httpx

from fsm_celery.engine.ports import Webhook

SENDERS = 8  # receivers tried at once
ANSWER_CHARS = 300  # of a receiver's answer kept as the error


def post_all(hooks: Sequence[Webhook], timeout: float) -> list[str | None]:
    """POST each webhook; the outcome of each, in order (never raises)."""
    if not hooks:
        return []
    with (
        httpx.Client(timeout=timeout, follow_redirects=False) as http,
        ThreadPoolExecutor(min(SENDERS, len(hooks))) as pool,
    ):
        return list(pool.map(lambda hook: _post(http, hook), hooks))


def _post(http: httpx.Client, hook: Webhook) -> str | None:
    try:
        response = http.post(hook.url, content=hook.body, headers=hook.headers)
    except httpx.HTTPError as exc:
        return f"{type(exc).__name__}: {exc}"[:ANSWER_CHARS]
    if 200 <= response.status_code < 300:
        return None
    return f"HTTP {response.status_code}: {response.text[:ANSWER_CHARS]}"
