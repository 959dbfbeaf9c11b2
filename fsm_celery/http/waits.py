"""The API's waits: people's decisions at approval gates (and the gates waiting for them), and
the outside events sent to machines, by an admin or signed with the machine type's secret."""

from __future__ import annotations

from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Header, HTTPException, Path, Query, Request
from fastapi.exceptions import RequestValidationError
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from fsm_celery.core import signal
from fsm_celery.core.signal import EVENT_PATTERN
from fsm_celery.engine.approvals import Authority
from fsm_celery.http import signed
from fsm_celery.http.auth import principal
from fsm_celery.http.deps import Decider, Fsm, Viewer, actor, client
from fsm_celery.http.examples import answer
from fsm_celery.http.models import DecisionRequest, EventRequest
from fsm_celery.store.tables import TYPE_CHARS

router = APIRouter()


@router.post(
    "/machines/{machine_id}/decisions",
    summary="Decide at a machine's approval gate: an approver votes, an admin overrides",
    responses=answer("decide"),
)
def decide(fsm: Fsm, who: Decider, machine_id: UUID, body: DecisionRequest) -> dict[str, Any]:
    decided = fsm.decide(
        machine_id,
        body.decision,
        actor(who, body.actor),  # naming another would vote as them
        fields=body.fields,
        comment=body.comment,
        via="dashboard" if who.via == "session" else "api",
        authority=Authority(admin=who.is_admin, groups=who.groups),
        attempt=body.attempt,
    )
    return {"decision": decided}


@router.get(
    "/machines/{machine_id}/decisions",
    summary="A machine's approval gates and the decisions made at them",
    responses=answer("decisions"),
)
def decisions(fsm: Fsm, _: Viewer, machine_id: UUID) -> dict[str, Any]:
    return fsm.decisions(machine_id)


@router.post(
    "/machines/{machine_id}/events/{name}",
    summary="Send a machine an outside event (an admin, or signed with its type's secret)",
    responses=answer("send_event"),
    openapi_extra={
        "requestBody": {
            "content": {"application/json": {"schema": EventRequest.model_json_schema()}}
        }
    },
)
async def send_event(
    request: Request,
    machine_id: UUID,
    name: Annotated[str, Path(min_length=1, max_length=50, pattern=EVENT_PATTERN)],
    x_fsm_signature_256: Annotated[str | None, Header(max_length=100)] = None,
    x_fsm_timestamp: Annotated[str | None, Header(max_length=20)] = None,
) -> dict[str, Any]:
    """An admin's token or session may send any event; anyone else signs it with the machine
    type's secret (FSM_EVENT_SECRETS): X-FSM-Timestamp, and X-FSM-Signature-256: sha256=<HMAC of
    the timestamp, method, path and body> (fsm_celery.core.signing)."""
    fsm = client(request)
    raw = await request.body()
    if len(raw) > signal.MAX_PAYLOAD_BYTES + 1024:
        raise HTTPException(413, f"the body is over {signal.MAX_PAYLOAD_BYTES + 1024} bytes")
    who = principal(request)
    sender, key = who.name, None
    if not who.is_admin:
        signer = await signed.signer(
            request, fsm, machine_id, name, raw, (x_fsm_signature_256, x_fsm_timestamp)
        )
        sender = signer.identity
        key = f"signature:{signer.digest}"  # without a key, the same signed request is one event
    body = _parsed(raw)
    key = body.key or key
    done = await run_in_threadpool(
        fsm.send_event, machine_id, name, body.payload, sender, via="api", key=key
    )
    return {"event": done}


def _parsed(raw: bytes) -> EventRequest:
    try:
        return EventRequest.model_validate_json(raw or b"{}")
    except ValidationError as exc:
        raise RequestValidationError(exc.errors(include_url=False)) from None


@router.get(
    "/machines/{machine_id}/events",
    summary="The outside events sent to a machine: kept, applied or refused",
    responses=answer("machine_events"),
)
def machine_events(fsm: Fsm, _: Viewer, machine_id: UUID) -> dict[str, Any]:
    return {"items": fsm.events(machine_id)}


@router.get(
    "/approvals",
    summary="Approval gates waiting for people, soonest deadline first",
    responses=answer("approvals"),
)
def approvals(
    fsm: Fsm,
    _: Viewer,
    limit: Annotated[int, Query(ge=1, le=500)] = 100,
    type: Annotated[str | None, Query(max_length=TYPE_CHARS)] = None,
) -> dict[str, Any]:
    return {"items": fsm.approvals(limit, type)}
