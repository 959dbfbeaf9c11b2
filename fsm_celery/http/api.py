"""The HTTP API under /api: machines (and the children, trees and fan-outs of those that fan
out), approval gates and outside events, agents, definitions, statistics, schedules and
rejected messages; the live feed is http/feed.py. Reads need a viewer (or public reads);
everything that acts needs an admin, and records who and why. Each route is one call of the
Python client; what the routes take is in http/deps.py, a list's page in http/paging.py."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import PlainTextResponse
from pydantic import ValidationError
from starlette.concurrency import run_in_threadpool

from fsm_celery.client import TREE_MOST, TREE_SHOWN
from fsm_celery.core import signal
from fsm_celery.core.admin import Action
from fsm_celery.core.graph import graph, to_dot
from fsm_celery.core.signal import EVENT_PATTERN
from fsm_celery.engine.approvals import Authority
from fsm_celery.http import feed, signed, starts
from fsm_celery.http.auth import principal
from fsm_celery.http.deps import Admin, Decider, Fsm, Viewer, actor, client, whole_machine_id
from fsm_celery.http.examples import answer
from fsm_celery.http.models import (
    DEFINITION_CHARS,
    EVENT_CHARS,
    STEP_MOST,
    TYPE_CHARS,
    VERSION_MOST,
    BudgetRequest,
    BulkRequest,
    CommandRequest,
    DecisionRequest,
    EventRequest,
    ForceRequest,
    RevokeRequest,
    RewindRequest,
    machine_filter,
)
from fsm_celery.http.paging import MachinePage, StepPage, machine_page, step_page
from fsm_celery.records import definition_view, jsonable
from fsm_celery.store.reads import MachineFilter

router = APIRouter(prefix="/api", dependencies=[Depends(whole_machine_id)])
router.include_router(starts.router)  # POST /api/machines, idempotent with a key
Where = Annotated[MachineFilter, Depends(machine_filter)]
Machines = Annotated[MachinePage, Depends(machine_page)]
Steps = Annotated[StepPage, Depends(step_page)]


@router.get(
    "/machines",
    summary="Machines, newest first, filtered; a page at a time",
    responses=answer("list_machines"),
)
def list_machines(fsm: Fsm, _: Viewer, page: Machines, where: Where) -> dict[str, Any]:
    # the page before the filters: its limit and cursor are the first parameters documented
    return page.machines(fsm.find_machines(where, page.asked, page.cursor))


@router.get(
    "/machines/count",
    summary="How many machines a filter selects, by status",
    responses=answer("count_machines"),
)
def count_machines(fsm: Fsm, _: Viewer, where: Where) -> dict[str, Any]:
    by_status = fsm.count_machines(where)
    return {"total": sum(by_status.values()), "by_status": by_status}


@router.post(
    "/machines/bulk",
    summary="Pause, resume, cancel or retry every machine a filter selects",
    responses=answer("bulk"),
)
def bulk(fsm: Fsm, who: Admin, body: BulkRequest) -> dict[str, Any]:
    results = fsm.bulk(
        Action(body.action),
        body.filter.to_filter(),
        actor(who, body.actor),
        body.reason,
        body.limit,
    )
    return {
        "done": sum(r.ok for r in results),
        "refused": sum(not r.ok for r in results),
        "results": [jsonable(asdict(r)) for r in results],
    }


@router.get(
    "/machines/{machine_id}",
    summary="One machine: context, usage, budget and its changes, history, notifications",
    responses=answer("get_machine"),
)
def get_machine(fsm: Fsm, who: Viewer, machine_id: UUID) -> dict[str, Any]:
    info = fsm.get_machine(machine_id)
    return {
        "machine": info.to_dict(),
        "history": [h.to_dict() for h in fsm.history(machine_id)],
        "forks": [f.to_dict() for f in fsm.forks(machine_id)],
        "notifications": fsm.notifications(machine_id, admin=who.is_admin),
        "budget_changes": fsm.budget_changes(machine_id),
    }


@router.get(
    "/machines/{machine_id}/history",
    summary="A machine's steps; with context=true, what each changed and the context after it",
    responses=answer("history"),
)
def history(
    fsm: Fsm,
    _: Viewer,
    machine_id: UUID,
    page: Steps,
    context: Annotated[bool, Query()] = False,
) -> dict[str, Any]:
    """A page of steps, those after step `after`; `next` is the `after` of the next page."""
    return page.steps(fsm.history(machine_id, context=context, after=page.after, limit=page.asked))


@router.get(
    "/machines/{machine_id}/context",
    summary="A machine's context as it was after a step (its latest without one)",
    responses=answer("context_at"),
)
def context_at(
    fsm: Fsm,
    _: Viewer,
    machine_id: UUID,
    step: Annotated[int | None, Query(ge=0, le=STEP_MOST)] = None,
) -> dict[str, Any]:
    return fsm.context_at(machine_id, step)


@router.get(
    "/machines/{machine_id}/replay",
    summary="A machine's recorded history run again against a stored version of its type "
    "(its newest without one), calling no agent: the same path, or where and why it diverges",
    responses=answer("replay"),
)
def replay(
    fsm: Fsm,
    _: Viewer,
    machine_id: UUID,
    version: Annotated[int | None, Query(ge=1, le=VERSION_MOST)] = None,
) -> dict[str, Any]:
    return fsm.replay(machine_id, version=version).to_dict()


@router.get(
    "/machines/{machine_id}/children",
    summary="The machines a machine's fan-out states started, newest first; a page at a time",
    responses=answer("children"),
)
def children(fsm: Fsm, _: Viewer, machine_id: UUID, page: Machines) -> dict[str, Any]:
    return page.machines(fsm.children(machine_id, page.asked, page.cursor))


@router.get(
    "/machines/{machine_id}/tree",
    summary="A machine and its descendants; past `shown` children, the others counted by status",
    responses=answer("tree"),
)
def tree(
    fsm: Fsm,
    _: Viewer,
    machine_id: UUID,
    shown: Annotated[int, Query(ge=0, le=100)] = TREE_SHOWN,
    most: Annotated[int, Query(ge=1, le=1000)] = TREE_MOST,
) -> dict[str, Any]:
    return {"tree": fsm.tree(machine_id, shown, most).to_dict()}


@router.get(
    "/machines/{machine_id}/fan-outs",
    summary="A machine's latest fan-outs: children done, failed, running, waiting, cancelled",
    responses=answer("fan_outs"),
)
def fan_outs(fsm: Fsm, _: Viewer, machine_id: UUID) -> dict[str, Any]:
    return {"items": [f.to_dict() for f in fsm.fan_outs(machine_id)]}


def _command(action: Action) -> Callable[..., dict[str, Any]]:
    """The route of one operator's command (the four without arguments of their own)."""

    def command(
        fsm: Fsm, who: Admin, machine_id: UUID, body: CommandRequest | None = None
    ) -> dict[str, Any]:
        body = body or CommandRequest()  # every field is optional: no body is an empty one
        act = getattr(fsm, action.value)
        return {"machine": act(machine_id, actor(who, body.actor), body.reason).to_dict()}

    command.__doc__ = f"{action.value.capitalize()} the machine (admin)."
    return command


for _action in (Action.PAUSE, Action.RESUME, Action.CANCEL, Action.RETRY):
    router.add_api_route(
        f"/machines/{{machine_id}}/{_action.value}",
        _command(_action),
        methods=["POST"],
        summary=f"{_action.value.capitalize()} a machine",
        name=f"{_action.value}_machine",
        responses=answer("command"),
    )


@router.post(
    "/machines/{machine_id}/force", summary="Move a machine to a state", responses=answer("force")
)
def force(fsm: Fsm, who: Admin, machine_id: UUID, body: ForceRequest) -> dict[str, Any]:
    info = fsm.force(machine_id, body.state, actor(who, body.actor), body.reason)
    return {"machine": info.to_dict()}


@router.post(
    "/machines/{machine_id}/rewind",
    summary="Put a machine back at a past step, with that step's context and edits",
    responses=answer("rewind"),
)
def rewind(fsm: Fsm, who: Admin, machine_id: UUID, body: RewindRequest) -> dict[str, Any]:
    done = fsm.rewind(machine_id, body.step, actor(who, body.actor), body.reason, body.set)
    return {"machine": done.machine.to_dict(), "step": done.step}


@router.post(
    "/machines/{machine_id}/fork",
    summary="Start a new machine from a past step of this one (which is untouched)",
    responses=answer("fork"),
)
def fork(fsm: Fsm, who: Admin, machine_id: UUID, body: RewindRequest) -> dict[str, Any]:
    forked = fsm.fork(machine_id, body.step, actor(who, body.actor), body.reason, body.set)
    return {"machine": fsm.get_machine(forked).to_dict()}


@router.put(
    "/machines/{machine_id}/budget",
    summary="Set a machine's budget (null or left out: no limit)",
    responses=answer("set_budget"),
)
def set_budget(
    fsm: Fsm, who: Admin, machine_id: UUID, body: BudgetRequest | None = None
) -> dict[str, Any]:
    body = body or BudgetRequest()
    info = fsm.set_budget(machine_id, actor(who, body.actor), body.tokens, body.cost, body.reason)
    return {"machine": info.to_dict()}


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
    name: Annotated[str, Path(min_length=1, max_length=EVENT_CHARS, pattern=EVENT_PATTERN)],
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
    machine_type: Annotated[str, Path(max_length=DEFINITION_CHARS)],
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


router.include_router(feed.router)
