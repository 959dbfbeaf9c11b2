"""The live feed: transitions as server-sent events, a few to a message, for the machines a
page follows (GET /api/events; fsm_celery.http.hub listens to Redis for them)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Annotated
from uuid import UUID

from fastapi import APIRouter, Query, Request
from sse_starlette.sse import EventSourceResponse

from fsm_celery.http.deps import Viewer
from fsm_celery.http.hub import MAX_FOLLOWED, RESYNC, EventHub, Interest
from fsm_celery.http.models import AGENT_TYPE_CHARS, TYPE_CHARS

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
    agent_type: Annotated[str | None, Query(max_length=AGENT_TYPE_CHARS)] = None,
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
