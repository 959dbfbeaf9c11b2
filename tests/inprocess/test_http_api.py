"""The HTTP API against its real database and Redis (FastAPI's TestClient: the real app without
a socket): every endpoint, each auth failure, each bad input a clear 4xx in JSON, never a 500."""

from __future__ import annotations

import json
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from sqlalchemy import select

from fsm_celery.core.transition import RejectReason
from fsm_celery.exceptions import ARCHIVED
from fsm_celery.http import create_app
from fsm_celery.store.tables import machines
from tests.support.credentials import ADMIN_TOKEN, VIEWER_TOKEN
from tests.support.processes import API_BASE, FsmEnv

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
MISSING = "00000000-0000-4000-8000-000000000000"


@pytest.fixture(scope="module")
def env(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    return env_factory("http_api")


@pytest.fixture(scope="module")
def http(env: FsmEnv) -> Iterator[Any]:
    with env.api() as client:
        yield client


def _error(response: Any, status: int, *words: str) -> dict[str, Any]:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert error["status"] == status
    for word in words:
        assert word in error["message"], error
    return dict(error)


def _start(http: Any, machine_type: str = "test_linear", **body: Any) -> dict[str, Any]:
    response = http.post("/api/machines", json={"type": machine_type, **body}, headers=ADMIN)
    assert response.status_code == 201, response.text
    machine: dict[str, Any] = response.json()["machine"]
    return machine


@pytest.mark.parametrize(
    ("context", "says"),
    [
        (
            {"githubIssue": 726},
            "context for cto_build_project: 'projectName' is a required property",
        ),
        (
            {"projectName": "sla-api", "githubIssue": 0},
            "context for cto_build_project: at /githubIssue: 0 is less than the minimum of 1",
        ),
    ],
)
def test_a_start_whose_context_its_schema_refuses_is_a_422_naming_the_field(
    http: Any, context: dict[str, Any], says: str
) -> None:
    before = http.get("/api/machines", params={"type": "cto_build_project"}, headers=ADMIN)
    response = http.post(
        "/api/machines", json={"type": "cto_build_project", "context": context}, headers=ADMIN
    )
    assert _error(response, 422)["message"] == says
    after = http.get("/api/machines", params={"type": "cto_build_project"}, headers=ADMIN)
    assert after.json() == before.json()


def test_a_start_whose_context_matches_its_schema_is_created(http: Any) -> None:
    machine = _start(http, "cto_build_project", context={"projectName": "sla", "githubIssue": 9})
    assert (machine["type"], machine["status"]) == ("cto_build_project", "running")


# -- who may ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("headers", "status", "says"),
    [
        ({}, 401, "token is needed"),
        ({"Authorization": "Bearer not-a-token"}, 401, "invalid token"),
        ({"Authorization": f"Basic {ADMIN_TOKEN}"}, 401, "Bearer <token>"),
        ({"Authorization": "Bearer "}, 401, "Bearer <token>"),
    ],
)
def test_reads_need_a_valid_token(
    http: Any, headers: dict[str, str], status: int, says: str
) -> None:
    response = http.get("/api/machines", headers=headers)
    _error(response, status, says)
    assert response.headers["www-authenticate"] == "Bearer"


def test_a_viewer_reads_and_may_not_act(http: Any, env: FsmEnv) -> None:
    machine = _start(http)
    assert http.get(f"/api/machines/{machine['id']}", headers=VIEWER).status_code == 200
    for method, path, body in [
        ("post", "/api/machines", {"type": "test_linear"}),
        ("post", f"/api/machines/{machine['id']}/pause", {}),
        ("put", f"/api/machines/{machine['id']}/budget", {"tokens": 1}),
        ("post", "/api/machines/bulk", {"action": "pause", "filter": {}}),
    ]:
        _error(getattr(http, method)(path, json=body, headers=VIEWER), 403, "admin")
        _error(getattr(http, method)(path, json=body), 401)
    assert env.client.get_machine(machine["id"]).status == "running"  # nothing changed


def test_reads_may_be_public_but_acting_never_is(env_factory: Callable[..., FsmEnv]) -> None:
    env = env_factory("http_public", public_reads=True)
    with env.api() as http:
        assert http.get("/api/machines").status_code == 200
        _error(http.post("/api/machines", json={"type": "test_linear"}), 401, "admin")


def test_the_app_refuses_to_serve_without_a_token(env: FsmEnv) -> None:
    from fsm_celery.exceptions import InsecureDashboard

    bare = env.settings.model_copy(update={"admin_token": "", "viewer_token": ""})
    with pytest.raises(InsecureDashboard, match="FSM_ADMIN_TOKEN"):
        create_app(bare, env.client)
    short = env.settings.model_copy(update={"admin_token": "short"})
    with pytest.raises(InsecureDashboard, match="shorter than 32 bytes"):
        create_app(short, env.client)


def test_a_session_acts_only_with_its_csrf_token(http: Any) -> None:
    machine = _start(http)
    with http.__class__(http.app, base_url=API_BASE) as browser:  # its own cookies
        page = browser.get("/login")
        csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
        signed = browser.post(
            "/login",
            data={"token": ADMIN_TOKEN, "name": "carol", "csrf": csrf, "next": "/"},
            follow_redirects=False,
        )
        assert signed.status_code == 303 and signed.headers["location"] == "/"
        stale = csrf  # signing in starts a new session, with a token of its own
        csrf = browser.get("/").text.split('name="csrf-token" content="')[1].split('"')[0]
        assert csrf != stale
        path = f"/api/machines/{machine['id']}/pause"
        _error(browser.post(path, json={}, headers={"x-csrf-token": stale}), 403)
        _error(browser.post(path, json={}), 403, "X-CSRF-Token")
        done = browser.post(path, json={"reason": "look"}, headers={"x-csrf-token": csrf})
        assert done.status_code == 200 and done.json()["machine"]["status"] == "paused"
        history = browser.get(f"/api/machines/{machine['id']}").json()["history"]
        assert (history[-1]["event"], history[-1]["actor"], history[-1]["reason"]) == (
            "pause",
            "carol",
            "look",
        )
        out = browser.post("/logout", data={"csrf": csrf}, follow_redirects=False)
        assert out.status_code == 303
        _error(browser.get("/api/machines"), 401)


def test_a_machine_page_says_why_its_history_is_empty(env: FsmEnv, http: Any) -> None:
    machine = _start(http)
    archived = uuid.uuid4()  # a machine whose month the retention removed: its row, no history
    with env.client.engine.db.begin() as conn:
        row = conn.execute(select(machines).where(machines.c.id == uuid.UUID(machine["id"]))).one()
        conn.execute(machines.insert().values({**row._asdict(), "id": archived}))
    with http.__class__(http.app, base_url=API_BASE) as browser:
        csrf = browser.get("/login").text.split('name="csrf" value="')[1].split('"')[0]
        browser.post("/login", data={"token": VIEWER_TOKEN, "csrf": csrf, "next": "/"})
        page = browser.get(f"/machines/{archived}")
        assert page.status_code == 200, page.text
        assert f"No history: {ARCHIVED}." in page.text
        assert "No history" not in browser.get(f"/machines/{machine['id']}").text


def test_a_wrong_token_at_sign_in_is_refused(http: Any) -> None:
    with http.__class__(http.app, base_url=API_BASE) as browser:
        page = browser.get("/login")
        csrf = page.text.split('name="csrf" value="')[1].split('"')[0]
        refused = browser.post("/login", data={"token": "guess", "csrf": csrf})
        assert refused.status_code == 401 and "not one this dashboard knows" in refused.text
        forged = browser.post("/login", data={"token": ADMIN_TOKEN, "csrf": "forged"})
        assert forged.status_code == 403


def test_a_session_ends_when_its_token_is_removed(env: FsmEnv, http: Any) -> None:
    rotated = env.settings.model_copy(update={"admin_token": "rotated-admin-" + "0123456789" * 3})
    other = create_app(rotated, env.client)  # the same session key: the same task secret
    with http.__class__(http.app, base_url=API_BASE) as browser:
        csrf = browser.get("/login").text.split('name="csrf" value="')[1].split('"')[0]
        browser.post("/login", data={"token": ADMIN_TOKEN, "csrf": csrf})
        cookies = browser.cookies
    with http.__class__(other, base_url=API_BASE, cookies=cookies) as stale:
        _error(stale.get("/api/machines"), 401, "no longer valid")


def test_pages_send_a_stranger_to_sign_in(http: Any) -> None:
    response = http.get("/machines/" + MISSING, follow_redirects=False)
    assert response.status_code == 303
    assert response.headers["location"] == f"/login?next=%2Fmachines%2F{MISSING}"
    assert "default-src 'self'" in response.headers["content-security-policy"]


# -- machines ---------------------------------------------------------------------------------


def test_a_machine_is_started_and_shown_with_its_history(http: Any) -> None:
    machine = _start(http, "test_linear", context={"n": 1}, github_issue=42)
    assert (machine["type"], machine["status"], machine["github_issue"]) == (
        "test_linear",
        "running",
        42,
    )
    shown = http.get(f"/api/machines/{machine['id']}", headers=VIEWER).json()
    assert shown["machine"]["context"]["n"] == 1
    assert [h["event"] for h in shown["history"]] == ["start"]


def test_the_list_pages_newest_first_with_a_cursor(env_factory: Callable[..., FsmEnv]) -> None:
    env = env_factory("http_paging")
    with env.api() as http:
        started = [_start(http)["id"] for _ in range(7)]
        seen: list[str] = []
        cursor = None
        while True:
            query = {"limit": 3, **({"cursor": cursor} if cursor else {})}
            page = http.get("/api/machines", params=query, headers=VIEWER).json()
            seen += [m["id"] for m in page["items"]]
            cursor = page["next"]
            if cursor is None:
                break
    assert seen == list(reversed(started))


def test_each_filter_selects_its_machines(http: Any, env: FsmEnv) -> None:
    agent = str(uuid.uuid4())
    mine = _start(http, "test_timeout", context={"who": "x"}, agent_id=agent, github_issue=777)
    other = _start(http, "test_linear")
    http.post(f"/api/machines/{other['id']}/pause", json={}, headers=ADMIN)

    def ids(**query: Any) -> set[str]:
        response = http.get("/api/machines", params={"limit": 500, **query}, headers=VIEWER)
        assert response.status_code == 200, response.text
        return {m["id"] for m in response.json()["items"]}

    assert mine["id"] in ids(type="test_timeout") and other["id"] not in ids(type="test_timeout")
    assert ids(agent_id=agent) == {mine["id"]}
    assert ids(github_issue=777) == {mine["id"]}
    assert other["id"] in ids(status="paused") and mine["id"] not in ids(status="paused")
    assert mine["id"] in ids(agent_type="tester") and mine["id"] not in ids(agent_type="cto")
    created = mine["created_at"]
    assert mine["id"] in ids(created_after=created) and mine["id"] not in ids(
        created_before=created
    )


@pytest.mark.parametrize(
    ("query", "status", "says"),
    [
        ({"status": "sleeping"}, 422, "query.status"),
        ({"limit": 0}, 422, "query.limit"),
        ({"limit": 501}, 422, "query.limit"),
        ({"github_issue": -1}, 422, "query.github_issue"),
        ({"github_issue": 2**40}, 422, "query.github_issue"),
        ({"agent_id": "nope"}, 422, "query.agent_id"),
        ({"created_after": "yesterday"}, 422, "query.created_after"),
        ({"cursor": "!!!"}, 400, "cursor"),
        ({"cursor": "eyJhIjogMX0"}, 400, "cursor"),
        ({"type": "x" * 121}, 422, "query.type"),  # a child's type, named by its place: 120
    ],
)
def test_a_bad_filter_is_a_clear_4xx(
    http: Any, query: dict[str, Any], status: int, says: str
) -> None:
    _error(http.get("/api/machines", params=query, headers=VIEWER), status, says)


@pytest.mark.parametrize(
    ("body", "status", "says"),
    [
        ('{"type": ', 400, "not valid JSON"),
        ("[]", 422, "body"),
        ('{"context": {}}', 422, "body.type"),
        ('{"type": "test_linear", "extra": 1}', 422, "body.extra"),
        ('{"type": "test_linear", "context": []}', 422, "body.context"),
        ('{"type": "test_linear", "github_issue": 4294967296}', 422, "body.github_issue"),
        ('{"type": "test_linear", "agent_id": "bob"}', 422, "body.agent_id"),
        ('{"type": "no_such_type"}', 404, "unknown machine type"),
        ('{"type": "test_linear", "context": {"s": "\\u0000"}}', 422, "NUL"),
        ('{"type": "test_linear", "context": ' + "[" * 5000 + "]" * 5000 + "}", 400, ""),
    ],
)
def test_a_bad_start_is_a_clear_4xx_and_starts_nothing(
    http: Any, env: FsmEnv, body: str, status: int, says: str
) -> None:
    before = len(env.client.list_machines(limit=10_000))
    response = http.post(
        "/api/machines", content=body, headers={**ADMIN, "content-type": "application/json"}
    )
    _error(response, status, says)
    assert len(env.client.list_machines(limit=10_000)) == before


def test_a_body_over_the_limit_is_refused_unread(http: Any) -> None:
    body = json.dumps({"type": "test_linear", "context": {"x": "y" * 2_000_000}})
    response = http.post(
        "/api/machines", content=body, headers={**ADMIN, "content-type": "application/json"}
    )
    _error(response, 413, "over")


def test_unknown_and_malformed_machine_ids(http: Any) -> None:
    _error(http.get(f"/api/machines/{MISSING}", headers=VIEWER), 404, "no machine")
    _error(http.get("/api/machines/nope", headers=VIEWER), 422, "path.machine_id")
    _error(http.post(f"/api/machines/{MISSING}/pause", json={}, headers=ADMIN), 404)


# -- commands -----------------------------------------------------------------------------------


def test_each_command_is_recorded_with_who_and_why(http: Any) -> None:
    machine = _start(http)
    path = f"/api/machines/{machine['id']}"

    def act(action: str, **body: Any) -> dict[str, Any]:
        response = http.post(f"{path}/{action}", json=body, headers=ADMIN)
        assert response.status_code == 200, response.text
        result: dict[str, Any] = response.json()["machine"]
        return result

    assert machine["commands"] == ["pause", "cancel", "retry", "force", "budget"]
    named = http.post(f"{path}/pause", json={"reason": "look", "actor": "dana"}, headers=ADMIN)
    _error(named, 422, "recorded as who signed in (admin)", "'dana'")  # a field names no one
    assert http.get(path, headers=VIEWER).json()["machine"]["status"] == "running"
    paused = act("pause", reason="look", actor="admin")  # repeating oneself is fine
    assert (paused["status"], paused["commands"]) == (
        "paused",
        ["resume", "cancel", "retry", "force", "budget"],
    )
    assert act("resume")["status"] == "running"
    assert act("force", state="TWO", reason="skip ahead")["current_state"] == "TWO"
    body = {"tokens": 500, "cost": 2.5, "reason": "big job"}
    budget = http.put(f"{path}/budget", json=body, headers=ADMIN)
    assert budget.json()["machine"]["budget_tokens"] == 500
    cancelled = act("cancel", reason="done with it")
    assert (cancelled["status"], cancelled["commands"]) == (
        "cancelled",
        ["retry", "force", "budget"],
    )
    shown = http.get(path, headers=VIEWER).json()
    assert shown["machine"]["commands"] == cancelled["commands"]
    [change] = shown["budget_changes"]
    assert (change["actor"], change["reason"], change["tokens"], change["previous_tokens"]) == (
        "admin",
        "big job",
        500,
        None,
    )
    history = shown["history"]
    assert [(h["event"], h["actor"], h["reason"]) for h in history[1:]] == [
        ("pause", "admin", "look"),
        ("resume", "admin", ""),
        ("force", "admin", "skip ahead"),
        ("cancel", "admin", "done with it"),
    ]


@pytest.mark.parametrize(
    ("action", "body", "status", "says"),
    [
        ("resume", {}, 409, "resume refused"),
        ("force", {"state": "NOWHERE"}, 409, "force refused"),
        ("force", {}, 422, "body.state"),
        ("pause", {"actor": "a" * 101}, 422, "body.actor"),
        ("pause", {"reason": "r" * 2001}, 422, "body.reason"),
        ("explode", {}, 405, ""),
    ],
)
def test_a_command_that_does_not_apply_changes_nothing(
    http: Any, action: str, body: dict[str, Any], status: int, says: str
) -> None:
    machine = _start(http)
    response = http.post(f"/api/machines/{machine['id']}/{action}", json=body, headers=ADMIN)
    if status == 405:
        assert response.status_code in (404, 405)
        assert "error" in response.json()
    else:
        _error(response, status, says)
    after = http.get(f"/api/machines/{machine['id']}", headers=VIEWER).json()
    assert after["machine"]["status"] == "running" and len(after["history"]) == 1


@pytest.mark.parametrize(
    "body",
    [{"tokens": -1}, {"cost": -0.5}, {"tokens": 2**64}, {"tokens": "many"}],
)
def test_a_bad_budget_is_refused(http: Any, body: dict[str, Any]) -> None:
    machine = _start(http)
    _error(http.put(f"/api/machines/{machine['id']}/budget", json=body, headers=ADMIN), 422)


def test_bulk_acts_on_what_the_filter_selects_and_reports_each(
    env_factory: Callable[..., FsmEnv],
) -> None:
    env = env_factory("http_bulk")
    with env.api() as http:
        ids = [_start(http, github_issue=9)["id"] for _ in range(3)]
        _start(http, github_issue=10)
        http.post(f"/api/machines/{ids[0]}/pause", json={}, headers=ADMIN)

        def count(query: str) -> dict[str, Any]:
            response = http.get(f"/api/machines/count?{query}", headers=VIEWER)
            assert response.status_code == 200, response.text
            counted: dict[str, Any] = response.json()
            return counted

        before = {"total": 3, "by_status": {"running": 2, "paused": 1}}
        assert count("github_issue=9") == before  # what the dashboard's bulk dialog says
        assert count("github_issue=9&status=paused") == {"total": 1, "by_status": {"paused": 1}}
        assert count("github_issue=11") == {"total": 0, "by_status": {}}
        _error(http.get("/api/machines/count?status=lost", headers=VIEWER), 422, "status")
        _error(http.get("/api/machines/count"), 401)
        body = {"action": "pause", "filter": {"github_issue": 9}, "reason": "freeze"}
        result = http.post("/api/machines/bulk", json=body, headers=ADMIN).json()
        assert (result["done"], result["refused"]) == (2, 1)  # one was paused already
        assert count("github_issue=9") == {"total": 3, "by_status": {"paused": 3}}
        assert {r["machine_id"] for r in result["results"]} == set(ids)
        statuses = {m.github_issue: m.status for m in env.client.list_machines(limit=100)}
        assert statuses[10] == "running"
        _error(
            http.post("/api/machines/bulk", json={"action": "force", "filter": {}}, headers=ADMIN),
            422,
            "body.action",
        )


# -- agents, definitions, stats, schedules, rejections -------------------------------------------


def test_agents_say_what_each_works_on(http: Any, env: FsmEnv) -> None:
    agent = uuid.uuid4()
    env.client.register_agent(agent, "tester")
    machine = _start(http, agent_id=str(agent))
    listed = http.get("/api/agents", headers=VIEWER).json()["items"]
    mine = next(a for a in listed if a["id"] == str(agent))
    assert machine["id"] in {w["id"] for w in mine["working_on"]}
    assert mine["working_on"][0]["current_state"] == "ONE"


def test_definitions_as_data_graph_and_dot(http: Any) -> None:
    versions = http.get("/api/definitions", headers=VIEWER).json()["items"]
    assert {"cto_fix_bug", "research_pipeline"} <= {v["type"] for v in versions}
    found = http.get("/api/definitions/research_pipeline", headers=VIEWER).json()
    assert found["valid"] and found["problems"] == []
    assert {n["id"] for n in found["graph"]["nodes"]} >= {"PENDING", "REVIEWING", "COMPLETE"}
    assert found["dot"].startswith('digraph "research_pipeline"')
    dot = http.get("/api/definitions/research_pipeline/graph.dot", headers=VIEWER)
    assert dot.headers["content-type"].startswith("text/vnd.graphviz")
    _error(http.get("/api/definitions/nope", headers=VIEWER), 404, "unknown machine type")
    _error(http.get("/api/definitions/cto_fix_bug?version=999", headers=VIEWER), 404)
    _error(http.get("/api/definitions/cto_fix_bug?version=0", headers=VIEWER), 422)


def test_stats_count_machines_states_and_rejections(http: Any) -> None:
    _start(http)
    stats = http.get("/api/stats", headers=VIEWER).json()
    assert stats["by_status"]["running"] >= 1 and stats["by_type"]["test_linear"] >= 1
    assert set(stats) >= {"machines", "by_agent_type", "states", "usage", "rejected", "as_of"}


def test_schedules_are_listed_paused_and_triggered(http: Any) -> None:
    listed = http.get("/api/schedules", headers=VIEWER).json()["items"]
    assert "cto_infrastructure_check/every-15-minutes" in {s["schedule"] for s in listed}
    base = "/api/schedules/cto_infrastructure_check/every-15-minutes"
    paused = http.post(f"{base}/pause", json={"reason": "window"}, headers=ADMIN).json()
    assert paused["schedule"]["paused"] is True
    started = http.post(f"{base}/trigger", json={}, headers=ADMIN).json()
    assert uuid.UUID(started["machine_id"])
    _error(http.post(f"{base}/explode", json={}, headers=ADMIN), 422, "path.action")
    _error(http.post("/api/schedules/nope/x/pause", json={}, headers=ADMIN), 404, "no schedule")
    http.post(f"{base}/resume", json={}, headers=ADMIN)


def test_rejections_are_listed(http: Any, env: FsmEnv) -> None:
    env.client.engine.inbox.reject('{"junk": true}', RejectReason.SCHEMA_VIOLATION, "junk")
    items = http.get("/api/rejected", headers=VIEWER).json()["items"]
    assert items and items[0]["reason"] == "schema_violation"
    _error(http.get("/api/rejected?limit=0", headers=VIEWER), 422, "query.limit")


def test_the_openapi_document_lists_every_route(http: Any) -> None:
    paths = http.get("/openapi.json").json()["paths"]
    for path in [
        "/api/machines",
        "/api/machines/{machine_id}",
        "/api/machines/count",
        "/api/machines/{machine_id}/force",
        "/api/machines/bulk",
        "/api/agents",
        "/api/definitions/{machine_type}",
        "/api/stats",
        "/api/events",
        "/webhooks/github",
    ]:
        assert path in paths


# -- the live feed --------------------------------------------------------------------------------


@pytest.mark.timeout(30)
def test_the_live_feed_carries_a_machines_transitions(http: Any) -> None:
    machine = _start(http)
    seen: list[dict[str, Any]] = []
    ready = threading.Event()
    url = f"/api/events?machine_id={machine['id']}"
    with http.stream("GET", url, headers=VIEWER) as stream:
        assert stream.headers["content-type"].startswith("text/event-stream")
        event = None
        for line in stream.iter_lines():
            if line.startswith("event:"):
                event = line.split(":", 1)[1].strip()
            elif line.startswith("data:") and event == "hello" and not ready.is_set():
                ready.set()
                http.post(f"/api/machines/{machine['id']}/pause", json={}, headers=ADMIN)
            elif line.startswith("data:") and event == "transitions":
                seen += json.loads(line.split(":", 1)[1])
                break
            elif line.startswith("data:") and event == "resync":  # missed: say so, not hang
                pytest.fail("the feed asked for a resync: its subscription came too late")
    assert (seen[0]["machineId"], seen[0]["event"], seen[0]["status"]) == (
        machine["id"],
        "pause",
        "paused",
    )
    _error(http.get("/api/events"), 401)


def test_an_admin_revokes_an_agent_recorded_as_its_own_identity(http: Any, env: FsmEnv) -> None:
    agent = str(uuid.uuid4())
    env.client.register_agent(agent, "tester", ["reset", "off"], actor="ops")
    path = f"/api/agents/{agent}/revoke"
    assert http.post(path, json={"reason": "r"}, headers=VIEWER).status_code == 403
    _error(http.post(path, json={"actor": "bob"}, headers=ADMIN), 422, "actor")  # not a field

    response = http.post(path, json={"reason": "left the team"}, headers=ADMIN)

    assert response.status_code == 200, response.text
    assert response.json() == {"agent": agent, "revoked": True, "user_deleted": False}
    events = env.client.credential_events(agent)
    assert [(e["action"], e["actor"], e["reason"]) for e in events] == [
        ("issued", "ops", ""),
        ("revoked", "admin", "left the team"),
    ]
    [row] = [a for a in http.get("/api/agents", headers=VIEWER).json()["items"] if a["id"] == agent]
    assert row["status"] == "revoked"


def test_revoking_an_unknown_agent_is_a_404(http: Any, env: FsmEnv) -> None:
    _error(http.post(f"/api/agents/{MISSING}/revoke", headers=ADMIN), 404, f"no agent {MISSING}")
    assert env.client.credential_events(MISSING) == []


def test_a_viewer_reads_a_long_history_with_its_contexts_a_bounded_page_at_a_time(
    env: FsmEnv, http: Any
) -> None:
    mid = _start(http)["id"]
    for _ in range(6):  # each command a step: 0 start, then 12 more
        env.client.pause(mid, "ops")
        env.client.resume(mid, "ops")
    whole = env.client.history(mid, context=True)
    pages, after = [], -1
    while after is not None:
        answer = http.get(
            f"/api/machines/{mid}/history",
            params={"context": "true", "limit": 5, "after": after},
            headers=VIEWER,
        )
        assert answer.status_code == 200, answer.text
        assert len(answer.json()["items"]) <= 5
        pages.append(answer.json()["items"])
        after = answer.json()["next"]
    assert [len(p) for p in pages] == [5, 5, 3]
    steps = [step for page in pages for step in page]
    assert [s["attempt"] for s in steps] == [r.attempt for r in whole]
    assert [s["context"] for s in steps] == [r.context for r in whole]  # folded, not restarted
    _error(
        http.get(f"/api/machines/{mid}/history", params={"limit": 501}, headers=VIEWER),
        422,
        "limit",
    )


def test_the_api_takes_the_short_ids_the_cli_and_dashboard_show(http: Any) -> None:
    mid = _start(http)["id"]
    short = mid[:8]
    shown = http.get(f"/api/machines/{short}", headers=VIEWER)
    assert shown.status_code == 200, shown.text
    assert shown.json()["machine"]["id"] == mid
    steps = http.get(f"/api/machines/{short}/history", headers=VIEWER)
    assert steps.status_code == 200 and steps.json()["items"][0]["event"] == "start"
    paused = http.post(f"/api/machines/{short}/pause", json={}, headers=ADMIN)
    assert paused.status_code == 200 and paused.json()["machine"]["status"] == "paused"
    # an outsider learns nothing of which ids exist: the same 401 for one that does and one not
    assert http.get(f"/api/machines/{short}").status_code == 401
    assert http.get("/api/machines/0123abcd").status_code == 401
    _error(http.get("/api/machines/0123abcd", headers=VIEWER), 404, "0123abcd")
