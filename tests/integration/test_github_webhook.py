"""POST /webhooks/github against the real app, database and Redis: GitHub's `issues` deliveries,
signed here with hmac/hashlib as GitHub signs them, start one machine per issue, once however
often and however concurrently they arrive; anything unsigned starts and records nothing."""

from __future__ import annotations

import hashlib
import hmac
import json
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from sqlalchemy import select
from sqlalchemy.engine import Row

from fsm_celery.agent.sdk import Agent, NoAck, Task
from fsm_celery.client import MachineInfo
from fsm_celery.store.tables import github_deliveries
from tests.support.agents import serving
from tests.support.credentials import WEBHOOK_SECRET
from tests.support.processes import FsmEnv

URL = "/webhooks/github"
REPO = "octo-org/hello-world"
BUILD = "cto_build_project"
BUG = "cto_fix_bug"
SIGNED = "<the body's own signature>"  # send()'s default: sign the bytes sent


# ---- GitHub's side --------------------------------------------------------------------------


def user(login: str, user_id: int = 1) -> dict[str, Any]:
    return {
        "login": login,
        "id": user_id,
        "node_id": f"MDQ6VXNlcj{user_id}",
        "avatar_url": f"https://avatars.githubusercontent.com/u/{user_id}?v=4",
        "url": f"https://api.github.com/users/{login}",
        "html_url": f"https://github.com/{login}",
        "type": "User",
        "site_admin": False,
    }


def issues_event(
    action: str,
    number: int,
    *,
    title: str = "Spelling error in the README file",
    labels: tuple[str, ...] = (),
    repo: str = REPO,
    assignee: str | None = None,
    sender: str = "octocat",
) -> dict[str, Any]:
    """The payload of an `issues` webhook event as GitHub documents it ("Webhook events and
    payloads", issues): the action, the issue, the repository and the sender; `assigned` also
    names the assignee at the top level."""
    owner, name = repo.split("/")
    assigned = [user(assignee, 2)] if assignee else []
    issue_url = f"https://api.github.com/repos/{repo}/issues/{number}"
    payload: dict[str, Any] = {
        "action": action,
        "issue": {
            "url": issue_url,
            "repository_url": f"https://api.github.com/repos/{repo}",
            "labels_url": issue_url + "/labels{/name}",
            "comments_url": issue_url + "/comments",
            "events_url": issue_url + "/events",
            "html_url": f"https://github.com/{repo}/issues/{number}",
            "id": 1_000_000 + number,
            "node_id": "MDU6SXNzdWUx",
            "number": number,
            "title": title,
            "user": user(sender),
            "labels": [
                {
                    "id": 208045946 + i,
                    "node_id": "MDU6TGFiZWwyMDgwNDU5NDY=",
                    "url": f"https://api.github.com/repos/{repo}/labels/{label}",
                    "name": label,
                    "description": "Something isn't working" if label == "bug" else None,
                    "color": "f29513",
                    "default": label == "bug",
                }
                for i, label in enumerate(labels)
            ],
            "state": "open",
            "locked": False,
            "assignee": assigned[0] if assigned else None,
            "assignees": assigned,
            "milestone": None,
            "comments": 0,
            "created_at": "2024-04-22T13:33:48Z",
            "updated_at": "2024-04-22T13:33:48Z",
            "closed_at": None,
            "author_association": "OWNER",
            "active_lock_reason": None,
            "body": "It looks like you accidentally spelled 'commit' with two 't's.",
            "reactions": {"url": issue_url + "/reactions", "total_count": 0},
            "timeline_url": issue_url + "/timeline",
            "performed_via_github_app": None,
            "state_reason": None,
        },
        "repository": {
            "id": 1296269,
            "node_id": "MDEwOlJlcG9zaXRvcnkxMjk2MjY5",
            "name": name,
            "full_name": repo,
            "private": False,
            "owner": {**user(owner, 3), "type": "Organization"},
            "html_url": f"https://github.com/{repo}",
            "description": "This your first repo!",
            "fork": False,
            "url": f"https://api.github.com/repos/{repo}",
            "default_branch": "main",
        },
        "sender": user(sender),
    }
    if action == "assigned":
        payload["assignee"] = assigned[0] if assigned else None
    return payload


def assigned(number: int, *, repo: str = REPO, title: str | None = None) -> dict[str, Any]:
    extra = {"title": title} if title is not None else {}
    return issues_event("assigned", number, repo=repo, assignee="monalisa", **extra)


def ping_event() -> dict[str, Any]:
    return {
        "zen": "Design for failure.",
        "hook_id": 109948940,
        "hook": {
            "type": "Repository",
            "id": 109948940,
            "name": "web",
            "active": True,
            "events": ["issues"],
            "config": {"content_type": "json", "insecure_ssl": "0", "url": "https://example.com"},
        },
        "repository": {"id": 1296269, "name": "hello-world", "full_name": REPO},
        "sender": user("octocat"),
    }


def github_signature(body: bytes, secret: str = WEBHOOK_SECRET) -> str:
    """X-Hub-Signature-256: the HMAC-SHA256 hex digest of the raw body, as GitHub computes it."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def github_headers(
    event: str, delivery: str | None, signature: str | None, body: bytes
) -> dict[str, str]:
    headers = {
        "Content-Type": "application/json",
        "User-Agent": "GitHub-Hookshot/044aadd",
        "X-GitHub-Event": event,
        "X-GitHub-Hook-ID": "109948940",
        "X-GitHub-Hook-Installation-Target-ID": "1296269",
        "X-GitHub-Hook-Installation-Target-Type": "repository",
        "X-Hub-Signature": "sha1=" + hmac.new(WEBHOOK_SECRET.encode(), body, "sha1").hexdigest(),
    }
    if delivery is not None:
        headers["X-GitHub-Delivery"] = delivery
    if signature is not None:
        headers["X-Hub-Signature-256"] = signature
    return headers


def new_delivery() -> str:
    return str(uuid.uuid4())  # GitHub's delivery ids are GUIDs


def send(
    http: Any,
    event: str,
    payload: Any,
    delivery: str | None = None,
    *,
    body: bytes | None = None,
    signature: str | None = SIGNED,
) -> httpx.Response:
    """POST the payload as GitHub does: raw JSON bytes, signed over exactly those bytes (unless
    a signature is given; None sends none)."""
    raw = json.dumps(payload).encode() if body is None else body
    sig = github_signature(raw) if signature is SIGNED else signature
    headers = github_headers(event, delivery or new_delivery(), sig, raw)
    response: httpx.Response = http.post(URL, content=raw, headers=headers)
    return response


# ---- what the deployment holds --------------------------------------------------------------


def machines_for(env: FsmEnv, issue: int | None = None) -> list[MachineInfo]:
    every = env.client.list_machines(limit=1000)
    return [m for m in every if issue is None or m.github_issue == issue]


def deliveries(env: FsmEnv) -> list[Row[Any]]:
    with env.client.engine.db.connect() as conn:
        return list(conn.execute(select(github_deliveries)).all())


def assert_json_error(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, response.text
    assert response.headers["content-type"].startswith("application/json")
    error = response.json()["error"]
    assert error["status"] == status
    assert isinstance(error["message"], str) and error["message"]
    return str(error["message"])


@pytest.fixture
def gh(env_factory: Callable[..., FsmEnv], request: pytest.FixtureRequest) -> FsmEnv:
    """A deployment of the test's own (its name derived from the test's id)."""
    return env_factory("gh_" + hashlib.sha1(request.node.nodeid.encode()).hexdigest()[:12])


# ---- starting -------------------------------------------------------------------------------


def test_an_assigned_issue_starts_one_build_machine_named_in_the_answer(gh: FsmEnv) -> None:
    with gh.api() as http:
        response = send(http, "issues", assigned(1347, title="Add a dark mode"))

    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["outcome"] == "started"
    assert set(answer) == {"outcome", "machine_id", "detail"}
    [machine] = machines_for(gh)
    assert answer["machine_id"] == str(machine.id)
    assert machine.type == BUILD
    assert machine.status == "running"
    assert machine.github_issue == 1347
    assert machine.context["repository"] == REPO
    assert machine.context["githubIssue"] == 1347
    assert machine.context["issueTitle"] == "Add a dark mode"
    assert machine.context["issueUrl"] == f"https://github.com/{REPO}/issues/1347"
    assert machine.context["assignee"] == "monalisa"
    assert machine.context["projectName"] == "hello-world"


def test_the_started_delivery_is_recorded_with_its_machine(gh: FsmEnv) -> None:
    delivery = new_delivery()
    with gh.api() as http:
        answer = send(http, "issues", assigned(7), delivery).json()

    [row] = deliveries(gh)
    assert row.id == delivery
    assert (row.event, row.action, row.outcome) == ("issues", "assigned", "started")
    assert (row.repository, row.issue) == (REPO, 7)
    assert str(row.machine_id) == answer["machine_id"]


def test_the_same_delivery_sent_twice_starts_one_machine_and_the_second_is_a_duplicate(
    gh: FsmEnv,
) -> None:
    delivery = new_delivery()
    with gh.api() as http:
        first = send(http, "issues", assigned(21), delivery)
        again = send(http, "issues", assigned(21), delivery)  # GitHub's "Redeliver"

    assert first.status_code == 200 and first.json()["outcome"] == "started"
    assert again.status_code == 200, again.text
    assert again.json()["outcome"] == "duplicate"
    assert again.json()["machine_id"] is None
    [machine] = machines_for(gh)
    assert str(machine.id) == first.json()["machine_id"]
    [row] = deliveries(gh)
    assert row.outcome == "started"  # the redelivery did not overwrite what the first did


def test_another_delivery_for_an_issue_whose_machine_runs_starts_nothing(gh: FsmEnv) -> None:
    with gh.api() as http:
        first = send(http, "issues", assigned(33))
        second = send(http, "issues", assigned(33))  # reassigned: a new delivery id

    running_id = first.json()["machine_id"]
    assert second.status_code == 200, second.text
    assert second.json()["outcome"] == "running"
    assert second.json()["machine_id"] == running_id
    assert [str(m.id) for m in machines_for(gh, 33)] == [running_id]
    outcomes = sorted(row.outcome for row in deliveries(gh))
    assert outcomes == ["running", "started"]


def test_a_running_machine_counts_for_its_issue_whatever_its_agent_wrote_to_its_context(
    gh: FsmEnv,
) -> None:
    """The machine was started for the issue of that repository: an agent's output that merges a
    key named `repository` into the context (a git remote, say) does not make it another
    issue's, and a second delivery for the issue must not start a second machine."""
    gh.start_worker(beat=False)
    gh.start_bridge()
    agent = Agent("cto", redis_url=gh.settings.redis_url, prefix=gh.settings.channel_prefix)
    creating = threading.Event()

    @agent.handler(BUILD, "ANALYZE_ISSUE")
    def analyze(task: Task) -> dict[str, Any]:
        remote = "git@github.com:octo-org/sla-api.git"
        return {"needsSpec": False, "complexity": "low", "repository": remote}

    @agent.handler(BUILD, "CREATE_PROJECT")
    def create(task: Task) -> dict[str, Any]:
        creating.set()
        raise NoAck  # the machine stays running in CREATE_PROJECT

    with serving(agent), gh.api() as http:
        first = send(http, "issues", assigned(37))
        assert first.json()["outcome"] == "started"
        assert creating.wait(30), "the machine never reached CREATE_PROJECT"
        running = gh.client.get_machine(first.json()["machine_id"])
        assert running.status == "running"
        assert running.context["repository"] != REPO  # what the agent wrote
        second = send(http, "issues", assigned(37))

    assert second.json()["outcome"] == "running", second.json()
    assert second.json()["machine_id"] == first.json()["machine_id"]
    assert len(machines_for(gh, 37)) == 1


def test_a_paused_machine_still_counts_as_running_for_its_issue(gh: FsmEnv) -> None:
    with gh.api() as http:
        first = send(http, "issues", assigned(34))
        gh.client.pause(first.json()["machine_id"], actor="test", reason="hold on")
        second = send(http, "issues", assigned(34))

    assert second.json()["outcome"] == "running"
    assert second.json()["machine_id"] == first.json()["machine_id"]
    assert len(machines_for(gh, 34)) == 1


def test_once_the_issues_machine_has_ended_a_new_delivery_starts_another(gh: FsmEnv) -> None:
    with gh.api() as http:
        first = send(http, "issues", assigned(35))
        gh.client.cancel(first.json()["machine_id"], actor="test", reason="start over")
        second = send(http, "issues", assigned(35))

    assert second.json()["outcome"] == "started"
    assert second.json()["machine_id"] != first.json()["machine_id"]
    assert len(machines_for(gh, 35)) == 2


def test_the_same_issue_number_in_another_repository_starts_its_own_machine(gh: FsmEnv) -> None:
    with gh.api() as http:
        here = send(http, "issues", assigned(36))
        there = send(http, "issues", assigned(36, repo="octo-org/other-repo"))

    assert here.json()["outcome"] == there.json()["outcome"] == "started"
    repos = sorted(m.context["repository"] for m in machines_for(gh, 36))
    assert repos == ["octo-org/hello-world", "octo-org/other-repo"]


def test_two_deliveries_for_one_issue_sent_concurrently_start_exactly_one_machine(
    gh: FsmEnv,
) -> None:
    issues = range(100, 108)  # a race each: more chances for an unlocked check to lose it
    answers: dict[int, list[dict[str, Any]]] = {issue: [] for issue in issues}
    failures: list[BaseException] = []

    with gh.api() as http:
        for issue in issues:
            barrier = threading.Barrier(2)

            def deliver(issue: int = issue, barrier: threading.Barrier = barrier) -> None:
                body = json.dumps(assigned(issue)).encode()
                headers = github_headers("issues", new_delivery(), github_signature(body), body)
                try:
                    barrier.wait(10)
                    response = http.post(URL, content=body, headers=headers)
                    assert response.status_code == 200, response.text
                    answers[issue].append(response.json())
                except BaseException as exc:
                    failures.append(exc)

            threads = [threading.Thread(target=deliver) for _ in range(2)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(30)

    assert not failures, failures
    for issue in issues:
        started = machines_for(gh, issue)
        assert len(started) == 1, f"issue {issue}: {len(started)} machines"
        outcomes = sorted(answer["outcome"] for answer in answers[issue])
        assert outcomes == ["running", "started"], f"issue {issue}: {outcomes}"
        assert {answer["machine_id"] for answer in answers[issue]} == {str(started[0].id)}


def test_an_issue_opened_with_the_bug_label_starts_the_bug_fix_machine(gh: FsmEnv) -> None:
    payload = issues_event("opened", 58, title="Crash on save", labels=("bug", "p1"))
    with gh.api() as http:
        response = send(http, "issues", payload)

    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "started"
    [machine] = machines_for(gh)
    assert str(machine.id) == response.json()["machine_id"]
    assert machine.type == BUG
    assert machine.github_issue == 58
    assert machine.context["repository"] == REPO
    assert machine.context["issueTitle"] == "Crash on save"


@pytest.mark.parametrize(
    ("payload", "machine_type", "state", "prompt"),
    [
        (
            assigned(1347),
            BUILD,
            "ANALYZE_ISSUE",
            "Read GitHub issue #1347 of project hello-world. Decide its scope and whether it "
            "needs a written spec before coding.",
        ),
        (
            issues_event("opened", 58, labels=("bug",)),
            BUG,
            "ANALYZE_BUG",
            "Analyse the bug reported in GitHub issue #58 of hello-world.",
        ),
    ],
    ids=["build", "bug"],
)
def test_a_delivery_gives_its_machine_every_key_the_first_prompt_uses(
    gh: FsmEnv, payload: dict[str, Any], machine_type: str, state: str, prompt: str
) -> None:
    """The project's name comes from the repository's (no "of project ." sent to an agent)."""
    gh.start_worker(beat=False)
    gh.start_bridge()
    agent = Agent("cto", redis_url=gh.settings.redis_url, prefix=gh.settings.channel_prefix)
    prompts: list[str] = []
    received = threading.Event()

    @agent.handler(machine_type, state)
    def first(task: Task) -> dict[str, Any]:
        prompts.append(task.message.prompt)
        received.set()
        raise NoAck

    with serving(agent), gh.api() as http:
        response = send(http, "issues", payload)
        assert response.json()["outcome"] == "started", response.text
        assert received.wait(30), "the first state_task never reached the agent"

    assert prompts == [prompt]
    [machine] = machines_for(gh)
    assert machine.context["projectName"] == "hello-world"
    assert machine.context["issueBody"] == payload["issue"]["body"]


@pytest.mark.parametrize(
    ("event", "payload"),
    [
        ("issues", issues_event("opened", 60, labels=("enhancement",))),
        ("issues", issues_event("opened", 61)),
        ("issues", issues_event("edited", 62, labels=("bug",))),
        ("issues", issues_event("closed", 63, labels=("bug",))),
        ("issues", issues_event("labeled", 64, labels=("bug",))),
        ("issues", issues_event("unassigned", 65)),
        ("issue_comment", issues_event("created", 66)),
        ("pull_request", assigned(67)),
    ],
    ids=[
        "opened-without-bug",
        "opened-unlabelled",
        "edited",
        "closed",
        "labeled",
        "unassigned",
        "issue_comment",
        "pull_request-assigned",
    ],
)
def test_other_issue_events_and_actions_start_nothing(
    gh: FsmEnv, event: str, payload: dict[str, Any]
) -> None:
    delivery = new_delivery()
    with gh.api() as http:
        response = send(http, event, payload, delivery)

    assert response.status_code == 200, response.text
    answer = response.json()
    assert answer["outcome"] == "ignored"
    assert answer["machine_id"] is None
    assert answer["detail"]
    assert machines_for(gh) == []
    [row] = deliveries(gh)
    assert (row.id, row.outcome, row.machine_id) == (delivery, "ignored", None)


def test_an_issues_payload_without_a_valid_issue_number_starts_nothing(gh: FsmEnv) -> None:
    payload = assigned(1)
    payload["issue"]["number"] = 2**31  # past PostgreSQL's integer
    with gh.api() as http:
        response = send(http, "issues", payload)

    assert response.status_code == 200, response.text
    assert response.json()["outcome"] == "ignored"
    assert machines_for(gh) == []


def _with_nul_in_action() -> dict[str, Any]:
    payload = assigned(38)
    payload["action"] = "assig\u0000ned"
    return payload


@pytest.mark.parametrize(
    "payload",
    [
        _with_nul_in_action(),
        assigned(39, repo="octo-org/hello\u0000world"),
        assigned(40, title="Crash on \u0000 in names"),
    ],
    ids=["action", "repository", "title"],
)
def test_a_signed_payload_with_a_nul_character_is_answered_without_a_500(
    gh: FsmEnv, payload: dict[str, Any]
) -> None:
    """PostgreSQL's text cannot hold NUL: a string carrying one is ignored or refused (4xx),
    never a server error."""
    with gh.api() as http:
        response = send(http, "issues", payload)

    assert response.status_code < 500, response.text
    assert response.headers["content-type"].startswith("application/json")
    if response.status_code == 200:
        assert response.json()["outcome"] == "ignored"
    else:
        assert_json_error(response, response.status_code)
    assert machines_for(gh) == []


# ---- refused --------------------------------------------------------------------------------


SIGNATURES: dict[str, Callable[[bytes], str | None]] = {
    "invalid": lambda _: "sha256=" + "0" * 64,
    "wrong-secret": lambda body: github_signature(body, "not-the-secret"),
    "sha1-only": lambda body: "sha1=" + hmac.new(WEBHOOK_SECRET.encode(), body, "sha1").hexdigest(),
    "garbage": lambda _: "not-a-signature",
    "missing": lambda _: None,
}


@pytest.mark.parametrize("signed", SIGNATURES.values(), ids=SIGNATURES.keys())
def test_a_delivery_without_a_valid_signature_is_refused_and_leaves_nothing(
    gh: FsmEnv, signed: Callable[[bytes], str | None]
) -> None:
    body = json.dumps(assigned(70)).encode()
    with gh.api() as http:
        response = send(http, "issues", None, body=body, signature=signed(body))

    assert_json_error(response, 401)
    assert machines_for(gh) == []
    assert deliveries(gh) == []


def test_a_signature_of_another_body_is_refused_and_leaves_nothing(gh: FsmEnv) -> None:
    signed = json.dumps(assigned(71)).encode()
    sent = json.dumps(assigned(72)).encode()
    with gh.api() as http:
        response = send(http, "issues", None, body=sent, signature=github_signature(signed))

    assert_json_error(response, 401)
    assert machines_for(gh) == []
    assert deliveries(gh) == []


NEEDS_MORE = """
type: ctx_deploy
agent_type: cto
initial_state: DEPLOY
context_schema:
  type: object
  required: [projectName, deployTarget]  # a delivery has no deployTarget
states:
  - {name: DEPLOY, prompt: "Deploy {{ projectName }} to {{ deployTarget }}.",
     on_success: DONE, on_failure: FAILED}
  - {name: DONE, terminal: completed}
  - {name: FAILED, terminal: failed}
"""


def test_a_delivery_whose_context_its_machine_type_refuses_is_a_422_recorded_as_refused(
    env_factory: Callable[..., FsmEnv], tmp_path: Path
) -> None:
    env = env_factory("gh_refused", github_build_type="ctx_deploy")
    (tmp_path / "ctx_deploy.yaml").write_text(NEEDS_MORE)
    env.client.load_definitions(str(tmp_path))
    delivery = new_delivery()
    with env.api() as http:
        response = send(http, "issues", assigned(90), delivery)
        again = send(http, "issues", assigned(90), delivery)  # GitHub's "Redeliver"

    assert response.status_code == 422, response.text
    assert response.json() == {
        "outcome": "refused",
        "machine_id": None,
        "detail": "context for ctx_deploy: 'deployTarget' is a required property",
    }
    assert (again.status_code, again.json()["outcome"]) == (200, "duplicate")
    assert machines_for(env) == []
    [row] = deliveries(env)
    assert (row.outcome, row.repository, row.issue, row.machine_id) == ("refused", REPO, 90, None)


def test_without_a_secret_the_webhook_is_off_and_starts_nothing(
    env_factory: Callable[..., FsmEnv],
) -> None:
    env = env_factory("gh_no_secret", github_webhook_secret="")
    with env.api() as http:
        response = send(http, "issues", assigned(80))

    message = assert_json_error(response, 503)
    assert "FSM_GITHUB_WEBHOOK_SECRET" in message
    assert machines_for(env) == []
    assert deliveries(env) == []


# ---- ping, bad bodies and headers -----------------------------------------------------------


def test_a_ping_is_answered_with_pong_and_starts_nothing(gh: FsmEnv) -> None:
    with gh.api() as http:
        response = send(http, "ping", ping_event())

    assert response.status_code == 200, response.text
    assert response.json() == {"outcome": "pong"}
    assert machines_for(gh) == []


def test_a_validly_signed_body_that_is_not_json_is_a_400(gh: FsmEnv) -> None:
    body = b"payload=%7B%22action%22%3A%22assigned%22%7D"  # a webhook set to form-encoded
    with gh.api() as http:
        response = send(http, "issues", None, body=body, signature=github_signature(body))

    assert_json_error(response, 400)
    assert machines_for(gh) == []
    assert deliveries(gh) == []


@pytest.mark.parametrize(
    ("drop", "replace"),
    [
        ("X-GitHub-Delivery", None),
        (None, ("X-GitHub-Delivery", "")),
        (None, ("X-GitHub-Delivery", "d" * 65)),
        ("X-GitHub-Event", None),
    ],
    ids=["delivery-missing", "delivery-empty", "delivery-too-long", "event-missing"],
)
def test_a_delivery_without_its_github_headers_is_a_4xx_json_error_never_a_500(
    gh: FsmEnv, drop: str | None, replace: tuple[str, str] | None
) -> None:
    body = json.dumps(assigned(90)).encode()
    headers = github_headers("issues", new_delivery(), github_signature(body), body)
    if drop is not None:
        del headers[drop]
    if replace is not None:
        headers[replace[0]] = replace[1]
    with gh.api() as http:
        response = http.post(URL, content=body, headers=headers)

    assert 400 <= response.status_code < 500, response.text
    assert_json_error(response, response.status_code)
    assert machines_for(gh) == []
    assert deliveries(gh) == []
