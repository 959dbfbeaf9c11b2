"""The signed door of outside events: who signed a request to POST /api/machines/{id}/events/
{name} (fsm_celery.core.signing says what the signature covers). The signature is checked, under
every machine type's secret, before the machine is read: an unsigned or badly signed request
gets one answer whether the machine exists or not, and never its type."""

from __future__ import annotations

import time
from uuid import UUID

from fastapi import HTTPException, Request
from starlette.concurrency import run_in_threadpool

from fsm_celery.client import Client
from fsm_celery.core import signing
from fsm_celery.exceptions import MachineNotFound
from fsm_celery.http.auth import unauthorized


async def signer(
    request: Request,
    fsm: Client,
    machine_id: UUID,
    name: str,
    raw: bytes,
    headers: tuple[str | None, str | None],
) -> signing.Signer:
    """The machine type whose secret signed the request (X-FSM-Signature-256, X-FSM-Timestamp)
    for this machine, which is of that type; else 401, 403 or 404."""
    signature, timestamp = headers
    if signature is None:
        raise unauthorized(
            "an admin's token, or X-FSM-Signature-256 under the machine type's secret"
        )
    settings = request.app.state.settings
    found = await run_in_threadpool(  # every type's secret is tried: off the event loop
        signing.signer_of,
        settings.event_secrets,
        signature,
        timestamp,
        ("POST", signing.event_path(machine_id, name), raw),
        time.time(),
        settings.event_signature_window_seconds,
    )
    if isinstance(found, signing.Unsigned):
        raise HTTPException(403, found.reason)
    machine_type = await run_in_threadpool(_type_of, fsm, machine_id)
    if machine_type != found.machine_type:  # none, or another type's: the same to the signer
        raise HTTPException(404, f"no {found.machine_type} machine {machine_id}")
    return found


def _type_of(fsm: Client, machine_id: UUID) -> str | None:
    try:
        return fsm.get_machine(machine_id).type.split(".")[0]
    except MachineNotFound:
        return None
