"""POST /api/machines: start a machine; idempotent with a key, given as the IETF
`Idempotency-Key` header (draft-ietf-httpapi-idempotency-key-header: a quoted structured-field
string, or the bare text) or as the body's `key`. A new machine is a 201; the machine a start
with the key made before, whatever its status now, a 200 with the same body; a key reused with
another type, context, agent or issue a 422 (the draft's code) naming what differs and the
machine that holds the key; a bad key, or a header and a body that name two keys, a 400."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Header, HTTPException, Response

from fsm_celery.core.start_key import checked_key
from fsm_celery.exceptions import InvalidStartKey
from fsm_celery.http.deps import Admin, Fsm
from fsm_celery.http.examples import ANSWERS
from fsm_celery.http.models import StartRequest

router = APIRouter()
HEADER = "Idempotency-Key"
IdempotencyKey = Annotated[
    str | None,
    Header(
        alias=HEADER,
        description="the start's key (as the body's `key`): started again with it, the same "
        "machine",
    ),
]


def _example(description: str) -> dict[str, Any]:
    return {
        "description": description,
        "content": {"application/json": {"example": ANSWERS["start_machine"]}},
    }


@router.post(
    "/machines",
    status_code=201,
    summary="Start a machine (idempotent with a key)",
    responses={
        201: _example("started"),
        200: _example("found: a start with the key made this machine before"),
        400: {"description": "the key is not one a start can hold, or two keys were given"},
        422: {"description": "the key holds a machine of another type or context"},
    },
)
def start_machine(
    fsm: Fsm,
    _: Admin,
    body: StartRequest,
    response: Response,
    idempotency_key: IdempotencyKey = None,
) -> dict[str, Any]:
    key = given_key(idempotency_key, body.key)
    started = fsm.start(body.type, body.context, body.agent_id, body.github_issue, key)
    if started.found:
        response.status_code = 200
    return {"machine": fsm.get_machine(started.machine_id).to_dict()}


def given_key(header: str | None, field: str | None) -> str | None:
    """The start's key, from the header or the body (400 when they differ, or it is bad)."""
    from_header = None if header is None else _unquoted(header)
    if from_header is not None and field is not None and from_header != field:
        raise HTTPException(
            400,
            f"{HEADER} {from_header!r} and the body's key {field!r} differ: give one key, "
            "in either",
        )
    key = from_header if from_header is not None else field
    if key is None:
        return None
    try:
        return checked_key(key)
    except InvalidStartKey as exc:
        where = f"{HEADER}: " if from_header is not None else "key: "
        raise HTTPException(400, where + str(exc)) from exc


def _unquoted(value: str) -> str:
    """The header's key: a structured-field string (RFC 8941, "…" with \\" and \\\\ escaped)
    as the draft writes it, else the value as it is."""
    if len(value) < 2 or not (value.startswith('"') and value.endswith('"')):
        return value
    inner, out, escaped = value[1:-1], [], False
    for char in inner:
        if escaped or char != "\\":
            out.append(char)
            escaped = False
        else:
            escaped = True
    if escaped:
        raise HTTPException(400, f"{HEADER} {value!r}: ends in a lone backslash")
    return "".join(out)
