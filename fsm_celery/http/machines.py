"""The API's machines: listed, counted, started, acted on in bulk; one machine's history,
context, replay, children, tree and fan-outs; the operator's commands, forks, rewinds and
budgets. Reads need a viewer; everything that acts needs an admin, and records who and why."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict
from typing import Annotated, Any
from uuid import UUID

from fastapi import APIRouter, Depends, Query

from fsm_celery.client import TREE_MOST, TREE_SHOWN
from fsm_celery.core.admin import Action
from fsm_celery.core.messages import INT32_MAX
from fsm_celery.http.deps import Admin, Fsm, Viewer, actor
from fsm_celery.http.examples import answer
from fsm_celery.http.models import (
    BudgetRequest,
    BulkRequest,
    CommandRequest,
    ForceRequest,
    RewindRequest,
    StartRequest,
    machine_filter,
)
from fsm_celery.http.paging import MachinePage, StepPage, machine_page, step_page
from fsm_celery.records import jsonable
from fsm_celery.store.reads import MachineFilter

router = APIRouter()
Where = Annotated[MachineFilter, Depends(machine_filter)]
Machines = Annotated[MachinePage, Depends(machine_page)]
Steps = Annotated[StepPage, Depends(step_page)]


@router.get(
    "/machines",
    summary="Machines, newest first, filtered; a page at a time",
    responses=answer("list_machines"),
)
def list_machines(fsm: Fsm, _: Viewer, page: Machines, where: Where) -> dict[str, Any]:
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
    "/machines", status_code=201, summary="Start a machine", responses=answer("start_machine", 201)
)
def start_machine(fsm: Fsm, _: Admin, body: StartRequest) -> dict[str, Any]:
    machine_id = fsm.start_machine(body.type, body.context, body.agent_id, body.github_issue)
    return {"machine": fsm.get_machine(machine_id).to_dict()}


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
    step: Annotated[int | None, Query(ge=0, le=INT32_MAX)] = None,
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
    version: Annotated[int | None, Query(ge=1, le=INT32_MAX)] = None,
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
