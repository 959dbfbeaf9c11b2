"""What the API's routes take: the client, who asks (a viewer), who acts (an admin, or a
decider at a gate), and the name an action is recorded under; and a machine id in the path
made whole from the start of one."""

from __future__ import annotations

import re
from typing import Annotated
from uuid import UUID

from fastapi import Depends, HTTPException, Request

from fsm_celery.client import Client
from fsm_celery.http.auth import Principal, admin, decider, principal, viewer


def client(request: Request) -> Client:
    found: Client = request.app.state.client
    return found


Fsm = Annotated[Client, Depends(client)]
Viewer = Annotated[Principal, Depends(viewer)]
Admin = Annotated[Principal, Depends(admin)]
Decider = Annotated[Principal, Depends(decider)]


def whole_machine_id(request: Request) -> None:
    """A machine id in the path may be the start of one (4 hex digits or more, as the CLI and
    the dashboard show them): made whole before the route reads it, for a reader alone (an
    outsider learns nothing of which ids exist)."""
    given = request.path_params.get("machine_id")
    if given is None or _whole(given):
        return
    viewer(request, principal(request))
    request.scope["path_params"]["machine_id"] = str(client(request).full_id(given))


def _whole(value: str) -> bool:
    """A whole id, or no id at all (the route's validation refuses that one, 422)."""
    if not re.fullmatch(r"[0-9a-fA-F-]{1,36}", value):
        return True
    try:
        UUID(value)
    except ValueError:
        return False
    return True


def actor(who: Principal, given: str | None) -> str:
    """Who acts: the signed-in identity. A body's `actor` may repeat it, never name another
    (an admin's credential acting as someone else would make the audit trail lie)."""
    if given is not None and given != who.name:
        raise HTTPException(
            422,
            f"actor: what you do is recorded as who signed in ({who.name}), "
            f"not as {given!r}; leave actor out",
        )
    return who.name
