"""The dashboard's sessions and what it shows of notifications, attacked as the security review
did: a cookie saved before signing out replayed against the real server; a session cookie over
plain HTTP; a viewer (and a public reader) reading a notification's receiver and its answer."""

from __future__ import annotations

import secrets
import threading
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient

from fsm_celery.http import create_app
from tests.support.credentials import ADMIN_TOKEN, VIEWER_TOKEN
from tests.support.processes import API_BASE, FsmEnv

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
ANSWER = "Traceback: password=hunter2 in /srv/receiver"  # what a receiver's error page says
SECRETS = ("hookuser", "hookpass", "secret-path", "T0K3N", "qs-secret", "hunter2")
NOTIFIED = """
type: test_notified
agent_type: tester
initial_state: WORK
notify: {{url: "{url}", "on": [cancelled]}}
states:
  - name: WORK
    on_success: DONE
    on_failure: FAILED
  - name: DONE
    terminal: completed
  - name: FAILED
    terminal: failed
"""


def _csrf(html: str, marker: str = 'name="csrf" value="') -> str:
    return html.split(marker)[1].split('"')[0]


def _session_cookie(response: httpx.Response) -> str:
    """The fsm_session cookie the response sets, as `name=value`."""
    [found] = [c for c in response.headers.get_list("set-cookie") if c.startswith("fsm_session=")]
    return found.split(";")[0]


def _sign_in(http: Any, token: str = ADMIN_TOKEN, name: str = "mallory") -> str:
    """Sign a TestClient in through the form; the session's CSRF token."""
    csrf = _csrf(http.get("/login").text)
    signed = http.post("/login", data={"token": token, "name": name, "csrf": csrf})
    assert signed.status_code == 200, signed.text
    return _csrf(http.get("/").text, 'name="csrf-token" content="')


# -- item 18: signing out ends the session ------------------------------------------------


@pytest.mark.timeout(60)
def test_a_cookie_saved_before_sign_out_no_longer_acts(
    env_factory: Callable[..., FsmEnv],
) -> None:
    """Through the real `fsm-celery dashboard`: sign in with the form, save the cookie and the
    CSRF token, sign out, replay an admin's POST with them: refused, the machine unchanged."""
    env = env_factory("http_signout")
    _, base = env.start_dashboard()
    machine_id = env.client.start_machine("test_linear", {})
    with httpx.Client(base_url=base, follow_redirects=False) as web:
        first = web.get("/login")
        assert "secure" in first.headers["set-cookie"].lower()  # Secure by default
        cookie = {"cookie": _session_cookie(first)}
        form = {"token": ADMIN_TOKEN, "name": "mallory", "csrf": _csrf(first.text)}
        signed = web.post("/login", data=form, headers=cookie)
        assert signed.status_code == 303, signed.text
        saved = {"cookie": _session_cookie(signed)}
        page = web.get("/", headers=saved)
        saved["x-csrf-token"] = _csrf(page.text, 'name="csrf-token" content="')
        acted = web.post(f"/api/machines/{machine_id}/pause", json={}, headers=saved)
        assert acted.status_code == 200, acted.text  # the saved pair acts while signed in
        web.post(f"/api/machines/{machine_id}/resume", json={}, headers=saved)
        out = web.post("/logout", data={"csrf": saved["x-csrf-token"]}, headers=saved)
        assert out.status_code == 303
        replay = web.post(f"/api/machines/{machine_id}/pause", json={}, headers=saved)
        assert replay.status_code == 401, replay.text
        assert "signed out" in replay.json()["error"]["message"]
        assert web.get("/api/machines", headers=saved).status_code == 401
    assert env.client.get_machine(machine_id).status == "running"
    assert [h.event for h in env.client.history(machine_id)][-2:] == ["pause", "resume"]


def test_signing_out_one_browser_leaves_another_signed_in(
    env_factory: Callable[..., FsmEnv],
) -> None:
    env = env_factory("http_sessions")
    machine_id = env.client.start_machine("test_linear", {})
    with env.api() as one, env.api() as two:
        csrf_one, csrf_two = _sign_in(one), _sign_in(two)
        one.post("/logout", data={"csrf": csrf_one})
        pause = f"/api/machines/{machine_id}/pause"
        assert one.post(pause, json={}, headers={"x-csrf-token": csrf_one}).status_code == 401
        done = two.post(pause, json={}, headers={"x-csrf-token": csrf_two})
        assert done.status_code == 200 and done.json()["machine"]["status"] == "paused"


def test_a_session_whose_id_expired_in_redis_is_refused(env_factory: Callable[..., FsmEnv]) -> None:
    env = env_factory("http_expiry")
    with env.api() as browser:
        _sign_in(browser)
        assert browser.get("/api/machines").status_code == 200
        keys = list(env.redis.scan_iter(f"{env.settings.channel_prefix}dashboard:session:*"))
        assert len(keys) == 1 and 0 < env.redis.ttl(keys[0]) <= 12 * 3600
        env.redis.delete(*keys)  # what its expiry does, 12 hours after sign-in
        assert browser.get("/api/machines").status_code == 401


@pytest.mark.parametrize(
    ("secure_cookies", "base", "secure"),
    [
        (True, "http://127.0.0.1:8000", True),
        (True, "https://dash.example.com", True),
        (False, "http://127.0.0.1:8000", False),
        (False, "http://localhost:8000", False),
        (False, "http://[::1]:8000", False),
        (False, "http://dash.example.com", True),  # plain HTTP elsewhere: still HTTPS-only
        (False, "http://127.0.0.1.evil.example", True),
        (False, "https://dash.example.com", True),
    ],
)
def test_the_session_cookie_is_secure_unless_plain_http_on_loopback_is_allowed(
    env_factory: Callable[..., FsmEnv], secure_cookies: bool, base: str, secure: bool
) -> None:
    env = env_factory("http_cookies")
    app = create_app(env.settings.model_copy(update={"secure_cookies": secure_cookies}), env.client)
    with TestClient(app, base_url=base) as browser:
        flags = browser.get("/login").headers["set-cookie"].lower().split("; ")
    assert ("secure" in flags) is secure
    assert "httponly" in flags and "samesite=strict" in flags


def test_a_browser_that_keeps_no_cookie_over_plain_http_is_told_why(
    env_factory: Callable[..., FsmEnv],
) -> None:
    env = env_factory("http_plain")
    with TestClient(
        create_app(env.settings, env.client), base_url="http://dash.example.com"
    ) as browser:
        csrf = _csrf(browser.get("/login").text)  # its Secure cookie is not kept over http
        refused = browser.post("/login", data={"token": ADMIN_TOKEN, "csrf": csrf})
    assert refused.status_code == 403
    assert "FSM_SECURE_COOKIES=false" in refused.text


def test_a_name_holding_nul_is_refused_at_sign_in(env_factory: Callable[..., FsmEnv]) -> None:
    env = env_factory("http_nul_name")
    with env.api() as browser:
        csrf = _csrf(browser.get("/login").text)
        refused = browser.post("/login", data={"token": ADMIN_TOKEN, "name": "a\x00", "csrf": csrf})
        assert refused.status_code == 400 and "NUL" in refused.text
        assert browser.get("/api/machines").status_code == 401


# -- item 17: what a viewer sees of a notification -------------------------------------------


@pytest.fixture(scope="module")
def receiver() -> Iterator[str]:
    """A receiver that answers every notification 500 with its own secrets in the body; its
    URL carries credentials, a secret path and a token in its query."""

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            self.rfile.read(int(self.headers["content-length"]))
            self.send_response(500)
            self.end_headers()
            self.wfile.write(ANSWER.encode())

        def log_message(self, *_: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    port = server.server_address[1]
    yield f"http://hookuser:hookpass@127.0.0.1:{port}/secret-path/T0K3N?key=qs-secret"
    server.shutdown()
    server.server_close()


@pytest.fixture(scope="module")
def notified(
    env_factory: Callable[..., FsmEnv], receiver: str, tmp_path_factory: pytest.TempPathFactory
) -> tuple[FsmEnv, str]:
    """A deployment whose machine was cancelled and notified the receiver, which failed."""
    env = env_factory("http_notified", notify_secret=secrets.token_hex(32))
    folder: Path = tmp_path_factory.mktemp("notified")
    (folder / "test_notified.yaml").write_text(NOTIFIED.format(url=receiver))
    env.client.load_definitions(str(folder))
    machine_id = env.client.start_machine("test_notified", {})
    env.client.cancel(machine_id, "ops", "not needed")
    assert env.client.engine.notifier.send_due() == (0, 1)
    return env, str(machine_id)


def _assert_hidden(text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, secret


def test_a_viewer_sees_only_the_receivers_host_and_no_answer(
    notified: tuple[FsmEnv, str], receiver: str
) -> None:
    env, machine_id = notified
    host = receiver.split("@")[1].split("/")[0]
    with env.api() as http:
        shown = http.get(f"/api/machines/{machine_id}", headers=VIEWER)
        page = http.get(f"/machines/{machine_id}", headers=VIEWER)
    [notification] = shown.json()["notifications"]
    assert (notification["url"], notification["last_error"]) == (f"http://{host}", "HTTP 500")
    _assert_hidden(shown.text)
    assert page.status_code == 200 and f"http://{host}" in page.text
    _assert_hidden(page.text)


def test_a_public_reader_sees_only_the_receivers_host(notified: tuple[FsmEnv, str]) -> None:
    env, machine_id = notified
    public = env.settings.model_copy(update={"public_reads": True})
    with TestClient(create_app(public, env.client), base_url=API_BASE) as http:
        shown = http.get(f"/api/machines/{machine_id}")
        page = http.get(f"/machines/{machine_id}")
        definition = http.get("/api/definitions/test_notified")
    assert shown.status_code == page.status_code == definition.status_code == 200
    for text in (shown.text, page.text, definition.text):
        _assert_hidden(text)


def test_an_admin_sees_the_path_and_the_answer_but_no_credentials(
    notified: tuple[FsmEnv, str], receiver: str
) -> None:
    env, machine_id = notified
    host = receiver.split("@")[1].split("/")[0]
    with env.api() as http:
        shown = http.get(f"/api/machines/{machine_id}", headers=ADMIN)
    [notification] = shown.json()["notifications"]
    assert notification["url"] == f"http://***@{host}/secret-path/T0K3N?***"
    assert notification["last_error"] == f"HTTP 500: {ANSWER}"
    for secret in ("hookuser", "hookpass", "qs-secret"):
        assert secret not in shown.text


def test_a_definitions_notify_url_is_shown_as_its_notifications_are(
    notified: tuple[FsmEnv, str], receiver: str
) -> None:
    env, _ = notified
    host = receiver.split("@")[1].split("/")[0]
    with env.api() as http:
        seen = http.get("/api/definitions/test_notified", headers=VIEWER)
        page = http.get("/definitions/test_notified", headers=VIEWER)
        full = http.get("/api/definitions/test_notified", headers=ADMIN)
    assert seen.json()["definition"]["notify"]["url"] == f"http://{host}"
    _assert_hidden(seen.text)
    _assert_hidden(page.text)
    assert full.json()["definition"]["notify"]["url"] == f"http://***@{host}/secret-path/T0K3N?***"
