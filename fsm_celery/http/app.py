"""The HTTP API and dashboard as one ASGI application.

`create_app()` builds it from FSM_* settings (what `fsm-celery dashboard` serves, and what
`uvicorn --factory fsm_celery.http:create_app` or gunicorn's uvicorn worker serve); tests pass
their own settings and client.

Every error is JSON under /api and /webhooks ({"error": {"status", "message", "details"}}),
never a 500 for a caller's mistake; the pages get the same message in HTML.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import redis
import sqlalchemy.exc
from fastapi import FastAPI, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fsm_celery.channel.redis import connect
from fsm_celery.client import Client
from fsm_celery.config import Settings, get_settings
from fsm_celery.core.messages import events_channel
from fsm_celery.exceptions import (
    AgentNotFound,
    CommandRefused,
    FsmError,
    InsecureDashboard,
    MachineNotFound,
    NotAnApprover,
    ScheduleNotFound,
    StepNotFound,
    UnknownMachineType,
    VersionNotFound,
)
from fsm_celery.http.api import router as api_router
from fsm_celery.http.auth import Auth, SessionCookies, Sessions
from fsm_celery.http.hub import EventHub
from fsm_celery.http.pages import error_page
from fsm_celery.http.pages import router as pages_router

log = logging.getLogger(__name__)
HERE = Path(__file__).parent
NOT_FOUND = (
    AgentNotFound,
    MachineNotFound,
    UnknownMachineType,
    ScheduleNotFound,
    StepNotFound,
    VersionNotFound,
)
STATUSES: tuple[tuple[type[Exception] | tuple[type[Exception], ...], int], ...] = (
    (NOT_FOUND, 404),
    (CommandRefused, 409),  # GateClosed too
    (NotAnApprover, 403),
)  # the rest (DefinitionError, InvalidContext, ...) 422
SECURITY_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; "
    "frame-ancestors 'none'; base-uri 'none'; form-action 'self'",
    "x-content-type-options": "nosniff",
    "referrer-policy": "same-origin",
    "x-frame-options": "DENY",
}


def create_app(settings: Settings | None = None, client: Client | None = None) -> FastAPI:
    """The application (refuses guessable secrets and tokenless serving: InsecureDashboard)."""
    settings = settings or get_settings()
    settings.require_secret()
    problem = settings.dashboard_problem()
    if problem is not None:
        raise InsecureDashboard(problem)
    if client is None:
        from fsm_celery import wiring

        client = wiring.client(settings)
    hub = EventHub(settings.redis_url, events_channel(settings.channel_prefix))
    sessions = connect(settings.redis_url)

    @asynccontextmanager
    async def lifespan(_: FastAPI) -> AsyncIterator[None]:
        hub.start()
        yield
        await hub.stop()
        sessions.close()

    app = FastAPI(
        title="fsm-celery",
        summary="Durable state machines that drive AI agents: see and steer them.",
        version=_version(),
        docs_url=None,  # Swagger UI and ReDoc load their assets from CDNs; /openapi.json stays
        redoc_url=None,
        lifespan=lifespan,
    )
    app.state.settings = settings
    app.state.auth = Auth(settings, Sessions(sessions, settings.channel_prefix))
    app.state.client = client
    app.state.hub = hub
    app.add_middleware(
        SessionCookies,
        secret_key=app.state.auth.session_key,
        plain_on_loopback=not settings.secure_cookies,
    )
    app.add_middleware(LimitBody, most=settings.max_request_bytes)
    app.add_middleware(RefuseNul)
    app.middleware("http")(_security_headers)
    _errors(app)
    app.include_router(api_router)
    app.include_router(pages_router)
    from fsm_celery.http.github import router as github_router

    app.include_router(github_router)
    from fsm_celery.http.metrics import count_requests
    from fsm_celery.http.metrics import router as metrics_router  # Prometheus's GET /metrics

    app.include_router(metrics_router)
    count_requests(client, settings)
    app.mount("/static", StaticFiles(directory=HERE / "static"), name="static")
    return app


class LimitBody:
    """Refuse a request body over `most` bytes with 413, before anything reads it whole."""

    def __init__(self, app: ASGIApp, most: int) -> None:
        self.app = app
        self.most = most

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and (not declared.isdigit() or int(declared) > self.most):
            await _too_large(self.most)(scope, receive, send)
            return
        seen = 0

        async def bounded() -> Message:
            nonlocal seen
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.most:
                raise HTTPException(413, f"the request body is over {self.most} bytes")
            return message

        await self.app(scope, bounded, send)


class RefuseNul:
    """Answer 400 to a path or query holding a NUL character, before anything looks it up:
    PostgreSQL's text and a file's name cannot hold one, and nothing of ours has one."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and (
            "\x00" in scope["path"] or b"%00" in scope["query_string"].lower()
        ):
            response = _reply(Request(scope), 400, "the URL holds a NUL character (%00)")
            await response(scope, receive, send)
            return
        await self.app(scope, receive, send)


def _too_large(most: int) -> Response:
    return _json(413, f"the request body is over {most} bytes")


async def _security_headers(
    request: Request, call_next: Callable[[Request], Awaitable[Response]]
) -> Response:
    response = await call_next(request)
    for name, value in SECURITY_HEADERS.items():
        response.headers.setdefault(name, value)
    return response


def _errors(app: FastAPI) -> None:
    """One JSON shape for every error (HTML for the pages), each with its status."""

    @app.exception_handler(StarletteHTTPException)  # FastAPI raises Starlette's too
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        return _reply(request, exc.status_code, str(exc.detail), headers=exc.headers)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> Response:
        errors = exc.errors()
        if any(e.get("type") == "json_invalid" for e in errors):
            return _reply(request, 400, "the request body is not valid JSON")
        details = [
            {"where": ".".join(str(p) for p in e.get("loc", ())), "message": e.get("msg")}
            for e in errors
        ]
        first = details[0] if details else {"where": "", "message": "invalid"}
        message = f"{first['where']}: {first['message']}"
        return _reply(request, 422, message, details)

    @app.exception_handler(RecursionError)
    async def too_deep(request: Request, _: RecursionError) -> Response:
        return _reply(request, 400, "the request body is nested too deeply")

    @app.exception_handler(FsmError)
    async def refused(request: Request, exc: FsmError) -> Response:
        status = next((code for kinds, code in STATUSES if isinstance(exc, kinds)), 422)
        return _reply(request, status, str(exc).splitlines()[0])

    @app.exception_handler(sqlalchemy.exc.OperationalError)
    @app.exception_handler(redis.ConnectionError)
    async def unreachable(request: Request, exc: Exception) -> Response:
        log.warning("a service is unreachable: %s", exc)
        return _reply(request, 503, "the database or Redis is unreachable; try again shortly")


def _reply(
    request: Request,
    status: int,
    message: str,
    details: list[dict[str, Any]] | None = None,
    headers: Mapping[str, str] | None = None,
) -> Response:
    path = request.url.path
    response: Response
    if path.startswith(("/api", "/webhooks", "/openapi")):
        response = _json(status, message, details)
    else:
        response = error_page(request, status, message)
    for name, value in (headers or {}).items():
        response.headers[name] = value
    return response


def _json(status: int, message: str, details: list[dict[str, Any]] | None = None) -> JSONResponse:
    error: dict[str, Any] = {"status": status, "message": message}
    if details:
        error["details"] = details
    return JSONResponse({"error": error}, status_code=status)


def _version() -> str:
    try:
        return version("fsm-celery")
    except PackageNotFoundError:
        return "0"
