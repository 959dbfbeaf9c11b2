"""POST /webhooks/github: a GitHub webhook (content type application/json), its signature
(X-Hub-Signature-256 under FSM_GITHUB_WEBHOOK_SECRET) checked before anything is read. What each
event does is fsm_celery.core.github's: `issues` start machines, `issue_comment` decides at
approval gates, `pull_request`, `check_suite` and `workflow_run` are outside events."""

from __future__ import annotations

import json
from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Request
from fastapi.responses import JSONResponse
from starlette.concurrency import run_in_threadpool

from fsm_celery.client import Client
from fsm_celery.core.github import signature_matches

router = APIRouter()
DELIVERY_CHARS = 64


@router.post(
    "/webhooks/github",
    summary=(
        "GitHub webhook: issues start machines, approvers' comments decide at gates, merged "
        "pull requests and finished checks are events for the machines waiting for them"
    ),
    response_model=None,
    responses={422: {"description": "refused: the delivery's context does not match the schema"}},
)
async def github_webhook(
    request: Request,
    x_github_event: Annotated[str, Header(max_length=50)],
    x_github_delivery: Annotated[str, Header(min_length=1, max_length=DELIVERY_CHARS)],
    x_hub_signature_256: Annotated[str | None, Header(max_length=100)] = None,
) -> dict[str, Any] | JSONResponse:
    secret = request.app.state.settings.github_webhook_secret
    if not secret:
        raise HTTPException(503, "the GitHub webhook is off: set FSM_GITHUB_WEBHOOK_SECRET")
    body = await request.body()
    if not signature_matches(secret, body, x_hub_signature_256):
        raise HTTPException(401, "X-Hub-Signature-256 does not match the body and the secret")
    if x_github_event == "ping":
        return {"outcome": "pong"}
    try:
        payload = json.loads(body)
    except (ValueError, RecursionError) as exc:
        raise HTTPException(
            400, "the body is not JSON (the webhook's content type must be application/json)"
        ) from exc
    fsm: Client = request.app.state.client
    done = await run_in_threadpool(fsm.github_delivery, x_github_delivery, x_github_event, payload)
    answer = {
        "outcome": done.outcome,
        "machine_id": str(done.machine_id) if done.machine_id else None,
        "detail": done.detail,
    }
    # a refusal is GitHub's failed delivery (a 4xx its settings page shows), not a success
    return JSONResponse(answer, 422) if done.outcome == "refused" else answer
