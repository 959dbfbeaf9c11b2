"""The dashboard's pages, rendered on the server: machines (with the agents at work), one
machine (its definition drawn, its history, its parent and children, its fan-outs' progress),
definitions, sign in and out. The browser script
(static/dashboard.js) makes them live from /api/events and sends admins' actions to /api."""

from __future__ import annotations

import json
from dataclasses import replace
from http import HTTPStatus
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlencode
from uuid import UUID

from fastapi import APIRouter, Depends, Form, HTTPException, Query, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.templating import Jinja2Templates

from fsm_celery import terminal
from fsm_celery.client import Client
from fsm_celery.client.machines import encode_cursor
from fsm_celery.core.admin import commands
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.graph import graph
from fsm_celery.core.transition import MachineStatus
from fsm_celery.exceptions import ARCHIVED, MachineNotFound
from fsm_celery.http.auth import (
    SESSION_COOKIE,
    Auth,
    Principal,
    csrf_token,
    plain_loopback,
    principal,
)
from fsm_celery.http.models import machine_filter
from fsm_celery.http.paging import CURSOR_CHARS, MachinePage
from fsm_celery.records import FanOutProgress, MachineInfo, definition_view
from fsm_celery.store.reads import MachineFilter
from fsm_celery.views import more_text

router = APIRouter(include_in_schema=False)
templates = Jinja2Templates(directory=Path(__file__).parent / "templates")
PAGE = 50
CHILDREN = 20  # children a machine's page lists; the others it counts by status
STATUSES = [s.value for s in MachineStatus]
COMMANDS = {s.value: commands(s) for s in MachineStatus}  # what the pages offer, live too


def duration(ms: int | None) -> str:
    """A duration as a person reads it (terminal.duration; static/dashboard.js writes live rows
    the same way), '—' for none."""
    return "—" if ms is None else terminal.duration(ms)


def retries_text(used: int, allowed: int | None) -> str:
    """The retries a state has used, of those it allows (static/dashboard.js says it too)."""
    if allowed is None:
        return "—"  # a terminal state is never tried
    if allowed == 0:
        return "no retries"
    if used == 0:
        return f"first try (up to {allowed} retries)"
    return f"retry {used} of {allowed}"


def deadline_text(machine: MachineInfo) -> str:
    """A machine's deadline as its page shows it: a finished or paused machine has none (the
    scan times out running machines only), whatever its last state's was (static/dashboard.js
    says it too)."""
    if machine.status == MachineStatus.PAUSED.value:
        return "none while paused"
    if machine.status != MachineStatus.RUNNING.value or machine.deadline_at is None:
        return "—"
    return machine.deadline_at.strftime("%Y-%m-%d %H:%M:%S")


templates.env.filters["duration"] = duration
templates.env.globals["deadline_text"] = deadline_text
templates.env.globals["retries_text"] = retries_text
templates.env.globals["more_text"] = more_text  # static/dashboard.js writes it the same way


def reader(request: Request, who: Annotated[Principal, Depends(principal)]) -> Principal:
    """Who reads the page; a visitor who may not is sent to sign in."""
    if who.role is None and not request.app.state.auth.public_reads:
        target = request.url.path + (f"?{request.url.query}" if request.url.query else "")
        raise HTTPException(303, "sign in", headers={"location": f"/login?{_next(target)}"})
    return who


Reader = Annotated[Principal, Depends(reader)]


def _client(request: Request) -> Client:
    found: Client = request.app.state.client
    return found


def _render(request: Request, name: str, who: Principal | None, **context: Any) -> HTMLResponse:
    return templates.TemplateResponse(
        request,
        name,
        {"who": who, "csrf": csrf_token(request), **_common(), **context},
    )


def _common() -> dict[str, Any]:
    return {"statuses": STATUSES, "commands": COMMANDS}


@router.get("/", response_class=HTMLResponse)
def machines_page(
    request: Request,
    who: Reader,
    where: Annotated[MachineFilter, Depends(machine_filter)],
    cursor: Annotated[str | None, Query(max_length=CURSOR_CHARS)] = None,
    children: Annotated[bool, Query(description="fan-outs' children listed too")] = False,
) -> HTMLResponse:
    fsm = _client(request)
    # a map of 10,000 items would bury the machines people started: its children are on its page
    roots = not children and where.parent_id is None
    where = replace(where, roots=where.roots or roots)
    asked = MachinePage(PAGE, cursor)
    page, last = asked.split(fsm.find_machines(where, asked.asked, asked.cursor))
    filters = {k: v for k, v in request.query_params.items() if k != "cursor" and v}
    more = None
    if last is not None:
        more = "/?" + urlencode({**filters, "cursor": encode_cursor(last.cursor)})
    types = fsm.machine_types()
    return _render(
        request,
        "machines.html",
        who,
        machines=page,
        agents=fsm.agents_at_work(),
        filters=filters,
        types=types,
        more=more,
        roots=where.roots,
    )


@router.get("/machines/{machine_id}", response_class=HTMLResponse)
def machine_page(request: Request, who: Reader, machine_id: str) -> HTMLResponse:
    fsm = _client(request)
    info = fsm.get_machine(_machine_id(machine_id))
    history = fsm.history(info.id, context=True)
    definition = fsm.definition(info.type, info.definition_version)
    fans_out = any(s.fans_out for s in definition.definition.states)  # else it has no children
    family = fsm.tree(info.id, CHILDREN, CHILDREN + 1) if fans_out else None
    fan_outs = fsm.fan_outs(info.id) if fans_out else []
    drawing = {
        "graph": graph(definition.definition).to_dict(),
        "current": info.current_state,
        "status": info.status,
        "visited": [[h.from_state, h.to_state] for h in history if h.from_state],
        "type": info.type,
        "fanOuts": _latest_per_state(fan_outs),
        "children": [c.to_dict() for c in family.children] if family else [],
    }
    return _render(
        request,
        "machine.html",
        who,
        machine=info,
        family=family,
        fan_outs=fan_outs,
        fans_out=fans_out,
        shown_children=CHILDREN,
        history=history,
        archived=ARCHIVED,
        notifications=fsm.notifications(info.id, admin=who.is_admin),
        budget_changes=fsm.budget_changes(info.id),
        states=[s.name for s in definition.definition.states],
        retries=_retries(definition.definition),
        drawing=json.dumps(drawing),
        context=json.dumps(info.context, indent=2, sort_keys=True),
        forks=fsm.forks(info.id),
        **_gate(fsm, info, definition.definition, who),
        **_waits(fsm, info, definition.definition),
    )


def _waits(fsm: Client, info: MachineInfo, definition: MachineDefinition) -> dict[str, Any]:
    """The event the machine waits for now (if its state waits for one), and the events sent
    to it."""
    if not any(s.wait for s in definition.states):
        return {"waiting_for": None, "events": []}
    state = definition.state(info.current_state)
    waits_now = state.wait is not None and info.status in ("running", "paused")
    return {
        "waiting_for": state.wait.event if waits_now and state.wait else None,
        "events": fsm.events(info.id),
    }


@router.get("/approvals", response_class=HTMLResponse)
def approvals_page(request: Request, who: Reader) -> HTMLResponse:
    return _render(request, "approvals.html", who, waiting=_client(request).approvals(PAGE))


def _gate(
    fsm: Client, info: MachineInfo, definition: MachineDefinition, who: Principal
) -> dict[str, Any]:
    """The machine's approval gates and their decisions; the one open now, with its form, and
    whether the reader may decide at it (an admin, or one of its groups)."""
    state = definition.state(info.current_state)
    made = fsm.decisions(info.id) if any(s.approval for s in definition.states) else None
    gates = made["gates"] if made else []
    open_now = next(
        (
            g
            for g in gates
            if g["closed_at"] is None
            and g["state"] == info.current_state
            and g["attempt"] == info.attempt
            and info.status in ("running", "paused")
        ),
        None,
    )
    approval = state.approval if open_now is not None else None
    return {
        "gate": open_now,
        "approval": approval,
        "form": form_fields(approval.form) if approval is not None else [],
        "may_decide": approval is not None
        and (who.is_admin or not who.groups.isdisjoint(approval.approvers)),
        "decisions": made["decisions"] if made else [],
    }


def form_fields(schema: dict[str, Any] | None) -> list[dict[str, Any]]:
    """A decision form's inputs, from its JSON Schema: a choice for an enum, a checkbox for a
    boolean, a number, or text (a text area past 200 characters)."""
    if not schema:
        return []
    required = set(schema.get("required", []))
    fields = []
    for name, spec in (schema.get("properties") or {}).items():
        spec = spec if isinstance(spec, dict) else {}
        kind = spec.get("type", "string")
        if "enum" in spec:
            widget = "choice"
        elif kind == "boolean":
            widget = "checkbox"
        elif kind in ("integer", "number"):
            widget = "number"
        else:
            widget = "area" if (spec.get("maxLength") or 0) > 200 else "text"
        fields.append(
            {
                "name": name,
                "widget": widget,
                "type": kind if isinstance(kind, str) else "string",
                "options": [str(o) for o in spec.get("enum", [])],
                "required": name in required,
                "description": str(spec.get("description", "")),
                "max_length": spec.get("maxLength"),
            }
        )
    return fields


def _latest_per_state(fan_outs: list[FanOutProgress]) -> dict[str, dict[str, Any]]:
    """Each fan-out state's latest fan-out (the graph shows its counts on the state's node)."""
    latest: dict[str, dict[str, Any]] = {}
    for f in fan_outs:  # newest first
        latest.setdefault(f.state, f.to_dict())
    return latest


def _machine_id(text: str) -> UUID:
    """The machine's id in the page's address; anything else names no machine (a 404)."""
    try:
        return UUID(text)
    except ValueError:
        raise MachineNotFound(text[:100]) from None


def _retries(definition: MachineDefinition) -> dict[str, int | None]:
    """Each state's retries (None for a terminal state, which has none)."""
    return {s.name: None if s.terminal else s.max_retries for s in definition.states}


@router.get("/definitions", response_class=HTMLResponse)
def definitions_page(request: Request, who: Reader) -> HTMLResponse:
    return _render(
        request, "definitions.html", who, versions=_client(request).definition_versions()
    )


@router.get("/definitions/{machine_type}", response_class=HTMLResponse)
def definition_page(
    request: Request,
    who: Reader,
    machine_type: str,
    version: Annotated[int | None, Query(ge=1)] = None,
) -> HTMLResponse:
    fsm = _client(request)
    found = fsm.definition(machine_type, version)
    schedules = [s for s in fsm.schedules() if s.machine_type == found.type and not s.removed]
    drawing: dict[str, Any] = {
        "graph": graph(found.definition).to_dict(),
        "current": None,
        "visited": [],
    }
    return _render(
        request,
        "definition.html",
        who,
        found=found,
        schedules=schedules,
        drawing=json.dumps(drawing),
        body=json.dumps(definition_view(found.definition.to_json(), admin=who.is_admin), indent=2),
    )


@router.get("/login", response_class=HTMLResponse)
def login_page(request: Request, next: str = "/") -> HTMLResponse:
    return _render(request, "login.html", None, next=_safe_next(next), failed=False)


@router.post("/login", response_model=None)
def login(
    request: Request,
    token: Annotated[str, Form(max_length=1000)],
    csrf: Annotated[str, Form(max_length=100)],
    name: Annotated[str, Form(max_length=100)] = "",
    next: Annotated[str, Form(max_length=2000)] = "/",
) -> Response:
    if csrf != csrf_token(request):
        raise HTTPException(403, _expired(request))
    if "\x00" in token + name + next:  # the name is recorded as the actor of what one does
        raise HTTPException(400, "the sign-in form holds a NUL character")
    auth: Auth = request.app.state.auth
    role = auth.open_session(request, token.strip(), name.strip() or "")
    if role is None:
        response = _render(request, "login.html", None, next=_safe_next(next), failed=True)
        response.status_code = 401
        return response
    if not name.strip():
        request.session["name"] = role.name.lower()
    return RedirectResponse(_safe_next(next), status_code=303)


@router.post("/logout")
def logout(request: Request, csrf: Annotated[str, Form(max_length=100)]) -> RedirectResponse:
    if csrf != csrf_token(request):
        raise HTTPException(403, "the sign-out form expired: load it again")
    auth: Auth = request.app.state.auth
    auth.close_session(request)
    return RedirectResponse("/login", status_code=303)


def _expired(request: Request) -> str:
    """Why the sign-in form's token does not match: a browser that kept no cookie over plain
    HTTP (the cookie is HTTPS-only) would otherwise be told to reload the form forever."""
    plain_allowed = not request.app.state.settings.secure_cookies and plain_loopback(request.scope)
    if request.url.scheme == "http" and SESSION_COOKIE not in request.cookies and not plain_allowed:
        return (
            "your browser kept no session cookie: it is sent over HTTPS only and this page "
            "came over plain HTTP; serve the dashboard over HTTPS, or set "
            "FSM_SECURE_COOKIES=false to sign in at http://127.0.0.1 or localhost"
        )
    return "the sign-in form expired: load it again"


def error_page(request: Request, status: int, message: str) -> Response:
    if status in (301, 302, 303, 307):
        return Response(status_code=status)
    context = {"who": _signed_in(request), "status": status, "message": message}
    context |= {"title": _title(status), **_common()}
    context["csrf"] = csrf_token(request) if "session" in request.scope else ""
    return templates.TemplateResponse(request, "error.html", context, status_code=status)


def _signed_in(request: Request) -> Principal | None:
    """Who reads the error page, so that it says who is signed in (None if nobody is)."""
    if "session" not in request.scope:  # refused before the session was read (413)
        return None
    try:
        return principal(request)
    except HTTPException:
        return None


def _title(status: int) -> str:
    try:
        return HTTPStatus(status).phrase
    except ValueError:
        return "Error"


def _safe_next(target: str) -> str:
    """Only a path of this site (no //host, no scheme): a sign-in cannot send you elsewhere."""
    if not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target


def _next(target: str) -> str:
    return urlencode({"next": target})
