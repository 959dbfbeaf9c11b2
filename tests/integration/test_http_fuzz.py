"""Never a 500 for a caller's input: every route of the app (API and pages, as a viewer and as an
admin) asked with each of its path and query parameters, and each field of its body, filled with
hostile values (NUL, very long text, invalid UTF-8 escapes, huge and negative numbers, unicode,
lone surrogates), against the real database and Redis. Routes are enumerated from the app, so a
route added later is fuzzed too."""

from __future__ import annotations

import json
import types
import typing
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from pydantic import BaseModel

from fsm_celery.http import api, github, metrics, pages
from tests.support.credentials import ADMIN_TOKEN, VIEWER_TOKEN
from tests.support.processes import FsmEnv

ROLES = {"viewer": VIEWER_TOKEN, "admin": ADMIN_TOKEN}
# What goes into the URL as it is (already escaped where it must be).
IN_URL = [
    "%00",
    "a%00b",
    "%2500",
    "x" * 4000,
    "%ff%fe",
    "%c3%28",
    "%ed%a0%80",
    "%zz",
    "%",
    "-1",
    "0",
    "99999999999999999999999",
    "-99999999999999999999999",
    "1e309",
    "NaN",
    "%F0%9F%98%80%E2%80%AE",
    "%EF%BC%91%EF%BC%92",
    "..%2F..%2Fetc%2Fpasswd",
    "'%20OR%201%3D1--",
    "",
    "9999-12-31T23:59:59%2B14:00",
    "0001-01-01T00:00:00",
    "-99999999999",
    "00000000-0000-0000-0000-000000000000",
    "true",
]
# What goes into a JSON body (sent as written: NaN, Infinity and lone surrogates included).
IN_BODY: list[Any] = [
    "\x00",
    "a\x00b",
    "x" * 100_000,
    "\udcff",
    "😀\u202e",
    "",
    -1,
    0,
    -(2**63) - 1,
    2**64,
    1e308,
    -1e308,
    float("nan"),
    float("inf"),
    True,
    None,
    [],
    {},
    {"\x00": 1},
    {"k": "\x00"},
    [2**64, "\x00"],
]
BODIES: dict[str, dict[str, Any]] = {
    "start_machine": {"type": "test_linear"},
    "bulk": {"action": "pause", "filter": {"status": "completed"}, "limit": 1},
    "force": {"state": "TWO"},
    "login": {"token": ADMIN_TOKEN, "name": "fuzz", "next": "/"},
}
ROUTES = [*api.router.routes, *pages.router.routes, *github.router.routes, *metrics.router.routes]


def _api_routes(routes: Any) -> list[APIRoute]:
    """The routes with parameters, through included routers (FastAPI includes them lazily)."""
    found: list[APIRoute] = []
    for route in routes:
        included = getattr(route, "original_router", None)
        if included is not None:
            found += _api_routes(included.routes)
        elif isinstance(route, APIRoute):
            found.append(route)
    return found


def _id(route: APIRoute) -> str:
    return f"{'|'.join(sorted(route.methods))} {route.path}"


def _params(route: APIRoute, kind: str) -> list[str]:
    """The route's parameters of a kind (path, query, body), its dependencies' included."""
    found: list[str] = []
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        found += [p.name for p in getattr(dependant, f"{kind}_params")]
        stack += dependant.dependencies
    return found


def _body_model(route: APIRoute) -> type[BaseModel] | None:
    stack = [route.dependant]
    while stack:
        dependant = stack.pop()
        for param in dependant.body_params:
            model = _model_in(param.field_info.annotation)
            if model is not None:
                return model
        stack += dependant.dependencies
    return None


def _model_in(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model an annotation names (through `X | None`), or None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if isinstance(annotation, types.UnionType) or typing.get_origin(annotation) is typing.Union:
        for arg in typing.get_args(annotation):
            found = _model_in(arg)
            if found is not None:
                return found
    return None


def _fields(model: type[BaseModel], prefix: str = "") -> Iterator[str]:
    """Every field's dotted path (a dict field's key too: `context.k`)."""
    for name, info in model.model_fields.items():
        path = prefix + name
        yield path
        inner = _model_in(info.annotation)
        if inner is not None:
            yield from _fields(inner, path + ".")
        elif "dict" in str(info.annotation):
            yield path + ".k"


def _with(body: dict[str, Any], path: str, value: Any) -> dict[str, Any]:
    """A deep copy of the body with the value at the dotted path."""
    copy: dict[str, Any] = json.loads(json.dumps(body))
    *parents, last = path.split(".")
    here = copy
    for name in parents:
        here = here.setdefault(name, {}) if isinstance(here.get(name, {}), dict) else {}
    here[last] = value
    return copy


@pytest.fixture(scope="module")
def env(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    return env_factory("http_fuzz")


@pytest.fixture(scope="module")
def http(env: FsmEnv) -> Iterator[Any]:
    with env.api() as client:
        yield client


@pytest.fixture(scope="module")
def valid(http: Any, env: FsmEnv) -> dict[str, str]:
    """A valid value for each path parameter: a real machine, type and schedule."""
    started = http.post(
        "/api/machines",
        json={"type": "test_linear"},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
    )
    assert started.status_code == 201, started.text
    machine_type, name = env.client.schedules()[0].key.split("/")
    return {
        "machine_id": started.json()["machine"]["id"],
        "machine_type": machine_type,
        "name": name,
        "action": "pause",
    }


class Fuzz:
    """Sends one route its hostile requests, and keeps every answer of 500 or more."""

    def __init__(self, http: Any, route: APIRoute, valid: dict[str, str], token: str) -> None:
        self.http = http
        self.route = route
        self.valid = valid
        self.token = token
        self.method = sorted(route.methods)[0]
        self.failures: list[str] = []

    def url(self, path_values: dict[str, str], query: str = "") -> str:
        path = self.route.path
        for name, value in path_values.items():
            path = path.replace("{" + name + "}", value)
        return path + (f"?{query}" if query else "")

    def send(self, url: str, body: bytes | None = None, form: bool = False) -> None:
        headers = {"Authorization": f"Bearer {self.token}"}
        if body is not None:
            headers["content-type"] = (
                "application/x-www-form-urlencoded" if form else "application/json"
            )
        if self.route.path == "/api/events" and self.method == "GET":
            with self.http.stream("GET", url, headers=headers) as response:
                status, text = response.status_code, "(stream)"
                if status >= 400:
                    response.read()
        else:
            response = self.http.request(self.method, url, headers=headers, content=body)
            status, text = response.status_code, response.text
        if status >= 500:
            sent = (body or b"")[:120].decode(errors="replace")
            self.failures.append(f"{self.method} {url[:200]} {sent} -> {status}: {text[:200]}")
        elif status >= 400 and url.startswith("/api"):
            message = response.json()["error"]["message"]
            assert message and "\n" not in message, (url[:200], message)

    def body(self, fields: dict[str, Any] | None = None) -> bytes | None:
        fields = BODIES.get(self.route.name, {}) if fields is None else fields
        if self.route.name in ("login", "logout"):
            return self.form(fields)
        if _body_model(self.route) is None and self.route.name != "github_webhook":
            return None
        return json.dumps(fields, allow_nan=True).encode()

    def form(self, fields: dict[str, Any]) -> bytes:
        csrf = self.http.get("/login").text.split('name="csrf" value="')[1].split('"')[0]
        merged = {"csrf": csrf, **fields}
        return "&".join(f"{k}={v}" for k, v in merged.items()).encode()

    def run(self) -> list[str]:
        for name in _params(self.route, "path"):
            for value in IN_URL:
                self.send(self.url({**self.valid, name: value}), self.body())
        valid_path = self.url(self.valid)
        for name in _params(self.route, "query"):
            for value in IN_URL:
                self.send(f"{valid_path}?{name}={value}", self.body())
        self.fuzz_body(valid_path)
        return self.failures

    def fuzz_body(self, valid_path: str) -> None:
        if self.route.name in ("login", "logout"):
            for name in _params(self.route, "body"):
                for value in IN_URL:
                    self.send(
                        valid_path,
                        self.form({**BODIES.get(self.route.name, {}), name: value}),
                        form=True,
                    )
            return
        model = _body_model(self.route)
        if model is None:
            return
        base = BODIES.get(self.route.name, {})
        for path in _fields(model):
            for value in IN_BODY:
                self.send(valid_path, self.body(_with(base, path, value)))


def test_every_route_of_the_app_is_fuzzed(http: Any) -> None:
    served = {_id(r) for r in _api_routes(http.app.routes)}
    assert served == {_id(r) for r in _api_routes(ROUTES)}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("role", ["viewer", "admin"])
@pytest.mark.parametrize("route", _api_routes(ROUTES), ids=_id)
def test_hostile_parameters_never_answer_500(
    http: Any, valid: dict[str, str], route: APIRoute, role: str
) -> None:
    failures = Fuzz(http, route, valid, ROLES[role]).run()
    assert not failures, "\n".join(failures)


@pytest.mark.timeout(300)
def test_the_real_server_never_answers_500_either(env: FsmEnv, valid: dict[str, str]) -> None:
    """The same through `fsm-celery dashboard` (uvicorn decodes paths and queries itself)."""
    _, base = env.start_dashboard()
    failures: list[str] = []
    with httpx.Client(base_url=base, timeout=30) as web:
        for route in _api_routes(ROUTES):
            failures += Fuzz(web, route, valid, ADMIN_TOKEN).run()
    assert not failures, "\n".join(failures)
