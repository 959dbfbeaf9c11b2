"""The API beyond one machine: agents (and their credentials revoked), definitions, statistics,
rejected messages, schedules, and the live feed of transitions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import asdict
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Path, Query, Request, Response
from fastapi.responses import PlainTextResponse
from sse_starlette.sse import EventSourceResponse

from fsm_celery.core.graph import graph, to_dot
from fsm_celery.http.deps import Admin, Fsm, Viewer, actor
from fsm_celery.http.examples import answer
from fsm_celery.http.hub import MAX_FOLLOWED, RESYNC, EventHub, Interest
from fsm_celery.http.models import CommandRequest, RevokeRequest
from fsm_celery.records import definition_view, jsonable
from fsm_celery.store.tables import TYPE_CHARS

router = APIRouter()
PING_SECONDS = 15
LINGER_SECONDS = 0.1  # a live page is sent at most ten messages a second
BATCH = 1000  # events in one message at most
FEED_EXAMPLE = (
    'event: hello\ndata: {}\n\nevent: transitions\ndata: [{"type": "state_event", '
    '"machineId": "3f2b8c1e-5d4a-4e8b-9c7d-2a1b0c9d8e7f", "event": "success", '
    '"from": "DESIGN", "to": "WRITE_CODE", "status": "running", "attempt": 3}]\n\n'
)


@router.get(
    "/agents",
    summary="Agents: status, last seen, what each works on now",
    responses=answer("list_agents"),
)
def list_agents(fsm: Fsm, _: Viewer) -> dict[str, Any]:
    return {"items": [jsonable(asdict(a)) for a in fsm.agents_at_work()]}


@router.post(
    "/agents/{agent_id}/revoke",
    summary="Revoke an agent's Redis credentials (admin; recorded as the signed-in identity)",
    responses=answer("revoke_agent"),
)
def revoke_agent(
    fsm: Fsm, who: Admin, agent_id: UUID, body: RevokeRequest | None = None
) -> dict[str, Any]:
    body = body or RevokeRequest()
    existed = fsm.revoke_agent(agent_id, who.name, body.reason)
    return {"agent": str(agent_id), "revoked": True, "user_deleted": existed}


@router.get(
    "/definitions",
    summary="Every version of every machine type",
    responses=answer("list_definitions"),
)
def list_definitions(fsm: Fsm, _: Viewer) -> dict[str, Any]:
    return {"items": fsm.definition_versions()}


@router.get(
    "/definitions/{machine_type}",
    summary="One version: states, edges, graph, check",
    responses=answer("get_definition"),
)
def get_definition(
    fsm: Fsm,
    who: Viewer,
    machine_type: Annotated[str, Path(max_length=50)],
    version: Annotated[int | None, Query(ge=1)] = None,
) -> dict[str, Any]:
    found = fsm.definition(machine_type, version)
    return {
        "type": found.type,
        "version": found.version,
        "versions": found.versions,
        "created_at": found.created_at.isoformat(),
        "valid": not found.problems,
        "problems": found.problems,
        "definition": definition_view(found.definition.to_json(), admin=who.is_admin),
        "graph": graph(found.definition).to_dict(),
        "dot": to_dot(found.definition),
    }


@router.get(
    "/definitions/{machine_type}/graph.dot",
    summary="One version drawn as Graphviz DOT",
    response_class=PlainTextResponse,
    responses={200: {"content": {"text/vnd.graphviz": {"example": "digraph cto_fix_bug { … }"}}}},
)
def definition_dot(
    fsm: Fsm,
    _: Viewer,
    machine_type: str,
    version: Annotated[int | None, Query(ge=1)] = None,
) -> Response:
    text = to_dot(fsm.definition(machine_type, version).definition)
    return PlainTextResponse(text, media_type="text/vnd.graphviz")


@router.get(
    "/stats",
    summary="Machines by status, type and agent type; durations; rejections",
    responses=answer("stats"),
)
def stats(fsm: Fsm, _: Viewer) -> dict[str, Any]:
    return fsm.stats()


@router.get(
    "/rejected",
    summary="The latest rejected messages, newest first",
    responses=answer("rejected"),
)
def rejected(
    fsm: Fsm,
    _: Viewer,
    machine_id: UUID | None = None,
    limit: Annotated[int, Query(ge=1, le=1000)] = 100,
) -> dict[str, Any]:
    return {"items": fsm.rejected(machine_id, limit)}


@router.get(
    "/schedules",
    summary="Every schedule with its next tick and latest run",
    responses=answer("list_schedules"),
)
def list_schedules(fsm: Fsm, _: Viewer) -> dict[str, Any]:
    return {"items": [asdict(s) | {"schedule": s.key} for s in fsm.schedules()]}


@router.post(
    "/schedules/{machine_type}/{name}/{action}",
    summary="Pause, resume or trigger a schedule",
    responses=answer("schedule_action"),
)
def schedule_action(
    fsm: Fsm,
    who: Admin,
    machine_type: str,
    name: str,
    action: Annotated[str, Path(pattern="^(pause|resume|trigger)$")],
    body: CommandRequest | None = None,
) -> dict[str, Any]:
    body = body or CommandRequest()
    ref, by = f"{machine_type}/{name}", actor(who, body.actor)
    if action == "trigger":
        return {"machine_id": str(fsm.trigger_schedule(ref, by, body.reason))}
    info = getattr(fsm, f"{action}_schedule")(ref, by, body.reason)
    return {"schedule": asdict(info) | {"schedule": info.key}}


@router.get(
    "/events",
    summary="The live feed: transitions as server-sent events",
    responses={200: {"content": {"text/event-stream": {"example": FEED_EXAMPLE}}}},
)
async def events(
    request: Request,
    _: Viewer,
    machine_id: Annotated[list[UUID] | None, Query(max_length=MAX_FOLLOWED)] = None,
    parent_id: Annotated[list[UUID] | None, Query(max_length=MAX_FOLLOWED)] = None,
    starts: bool = False,
    type: Annotated[str | None, Query(max_length=TYPE_CHARS)] = None,
    agent_type: Annotated[str | None, Query(max_length=10)] = None,
) -> EventSourceResponse:
    """Each `transitions` event carries a JSON array of state_events (what arrived within a
    tenth of a second). Ask for machines by id (repeat `machine_id`), for the children of
    machines (repeat `parent_id`: a fan-out's, started or to start) and, with `starts`, for
    the machines that start from now on (of `type`, `agent_type`), which are followed from
    then; with none of these, everything. `resync`: events were missed, reload what you show."""
    hub: EventHub = request.app.state.hub
    interest = Interest(
        machines=frozenset(str(m) for m in machine_id or ()),
        parents=frozenset(str(p) for p in parent_id or ()),
        starts=starts,
        machine_type=type,
        agent_type=agent_type,
    )

    async def stream() -> AsyncIterator[dict[str, str]]:
        async with hub.listen(interest) as listener:
            yield {"event": "hello", "data": "{}"}
            while True:
                batch = [await listener.queue.get()]
                await asyncio.sleep(LINGER_SECONDS)  # let a burst gather into one message
                while not listener.queue.empty() and len(batch) < BATCH:
                    batch.append(listener.queue.get_nowait())
                if RESYNC in batch:
                    yield {"event": RESYNC, "data": "{}"}
                else:
                    yield {"event": "transitions", "data": "[" + ",".join(batch) + "]"}

    return EventSourceResponse(stream(), ping=PING_SECONDS, send_timeout=30)
