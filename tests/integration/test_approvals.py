"""Approval gates on real processes: a Celery worker with beat, the ack bridge, the dashboard's
HTTP server and the Python client deciding at one gate at once; an admin and the CLI
overriding; deadlines escalated by beat's scan; the people asked through a real HTTP receiver,
signed."""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import pwd
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from fsm_celery.engine.approvals import Authority
from fsm_celery.exceptions import GateClosed
from tests.integration.test_github_webhook import REPO, issues_event, new_delivery, send, user
from tests.support import ROOT
from tests.support.agents import ScriptedAgent
from tests.support.credentials import ADMIN_TOKEN
from tests.support.processes import FsmEnv
from tests.support.receiver import Receiver, serve

ALICE = "alice-token-7f3a9c2e51d84b06a9e7c3f1d2b8e4a6"
CAROL = "carol-token-b19e4d7a30c65f28e1d9a4c7b3f60e52"
DAVE = "dave-token-4c8e1b7f2a9d36e05b7c1f8a4e2d9b63"
APPROVERS = {
    "alice": {"groups": ["release"], "token": ALICE},
    "bob": {"groups": ["release"]},
    "carol": {"groups": ["release"], "token": CAROL},
    "dave": {"groups": ["ops"], "token": DAVE},
    "erin": {"groups": ["release"], "github": "monalisa", "github_id": 2},
}
NOTIFY_SECRET = "notify-secret-for-the-approval-tests-3e8a1f"


@pytest.fixture(scope="module")
def gated(env_factory: Callable[..., FsmEnv], receiver_module: Receiver) -> Iterator[FsmEnv]:
    """A celery-mode deployment with approvers, its people asked at receiver_module's URL."""
    env = env_factory(
        "gates",
        approvers=APPROVERS,
        transition_mode="celery",
        notify_url=receiver_module.url,
        notify_secret=NOTIFY_SECRET,
        dashboard_url="https://fsm.example.com",
        github_build_type="test_gate",  # an assigned issue starts a machine with a gate
    )
    env.start_worker(beat=True)
    env.start_bridge()
    yield env


@pytest.fixture(scope="module")
def receiver_module() -> Iterator[Receiver]:
    with serve() as found:
        yield found


def _history_events(env: FsmEnv, machine_id: Any) -> list[str]:
    return [r.event for r in env.client.history(machine_id)]


def _gate_story(env: FsmEnv, machine_id: Any, outcomes: dict[str, Any]) -> str:
    """What each door answered, the machine's history and its gates with their decisions: a
    failure of a concurrent decision test explains itself."""
    history = [
        (r.from_state, r.to_state, r.event, r.attempt, r.actor, r.reason, str(r.created_at))
        for r in env.client.history(machine_id)
    ]
    made = env.client.decisions(machine_id)
    return (
        f"outcomes: {outcomes!r}\nhistory: {history}\n"
        f"gates: {made['gates']}\ndecisions: {made['decisions']}"
    )


def test_a_quorum_of_two_of_three_approvers_deciding_at_once_moves_the_machine_once(
    gated: FsmEnv,
) -> None:
    _, base = gated.start_dashboard()
    release = Authority(admin=False, groups=frozenset({"release"}))
    with ScriptedAgent(gated) as agent:
        mid = gated.client.start_machine("test_gate", {}, agent_id=agent.id)
        gated.wait_for_gate(mid, "REVIEW")
        start = threading.Barrier(3)
        outcomes: dict[str, Any] = {}

        def api() -> None:  # alice, with her own token, through the dashboard's HTTP server
            start.wait()
            try:
                answer = httpx.post(
                    f"{base}/api/machines/{mid}/decisions",
                    headers={"Authorization": f"Bearer {ALICE}"},
                    json={"decision": "approve", "fields": {"target": "staging"}},
                    timeout=60,
                )
                outcomes["alice"] = answer.status_code, answer.json()
            except Exception as exc:  # recorded for the failure message, not lost in the thread
                outcomes["alice"] = exc

        def client(person: str) -> Callable[[], None]:  # through the Python client
            def decide() -> None:
                start.wait()
                try:
                    fields = {"target": "staging"}
                    outcomes[person] = gated.client.decide(
                        mid, "approve", person, fields=fields, authority=release
                    )
                except Exception as exc:  # GateClosed for the late one; anything else, shown
                    outcomes[person] = exc

            return decide

        doors = (api, client("carol"), client("bob"))
        threads = [threading.Thread(target=door) for door in doors]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        try:
            gated.wait_until_done(mid, timeout=60)
        except AssertionError as exc:
            raise AssertionError(f"{exc}\n{_gate_story(gated, mid, outcomes)}") from None
    assert _history_events(gated, mid).count("approval") == 1, _gate_story(gated, mid, outcomes)
    made = gated.client.decisions(mid)
    [review] = made["gates"]
    assert (review["verdict"], review["approvals"]) == ("approved", 2), outcomes
    assert len(made["decisions"]) == 2  # the third came when the gate had closed
    [late] = {"alice", "carol", "bob"} - {d["actor"] for d in made["decisions"]}
    if late == "alice":
        assert outcomes["alice"][0] == 409 and "decision refused" in json.dumps(outcomes["alice"])
    else:
        assert isinstance(outcomes[late], GateClosed), outcomes
    assert gated.client.get_machine(mid).status == "completed"
    assert list(agent.states()) == ["BUILD", "SHIP"]  # no agent was sent REVIEW


def test_an_admin_or_the_cli_overrides_a_gate_and_never_votes_as_a_person(
    gated: FsmEnv,
) -> None:
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    body = {"decision": "approve", "fields": {"target": "staging"}}
    with ScriptedAgent(gated) as agent, gated.api() as http:
        mid = gated.client.start_machine("test_gate", {}, agent_id=agent.id)
        gated.wait_for_gate(mid, "REVIEW")
        url = f"/api/machines/{mid}/decisions"
        for name in ("alice", "bob"):  # one admin credential, two people named
            named = http.post(url, headers=admin, json={**body, "actor": name})
            assert named.status_code == 422 and "recorded as who signed in (admin)" in named.text
        argv = [sys.executable, "-m", "fsm_celery", "approve", str(mid)]
        for name in ("alice", "carol"):  # the CLI naming an approver, then a stranger
            done = subprocess.run(
                [*argv, "--field", "target=staging", "--actor", name],
                env=gated.env,
                cwd=ROOT,
                capture_output=True,
                text=True,
            )
            assert done.returncode == 2 and "cannot decide as" in done.stderr, done.stderr
        assert gated.client.decisions(mid)["decisions"] == []  # nothing was recorded
        page = http.get(f"/machines/{mid}", headers=admin).text  # an admin is told so
        assert 'id="override-note"' in page and "decides the gate outright" in page
        mine = http.post(url, headers={"Authorization": f"Bearer {ALICE}"}, json=body)
        assert mine.json()["decision"]["approvals"] == 1  # the real alice: one vote of two
        done = subprocess.run(
            [*argv, "--field", "target=staging", "--comment", "hotfix"],
            env=gated.env,
            cwd=ROOT,
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, done.stderr
        me = pwd.getpwuid(os.geteuid()).pw_name
        assert f"approved by override of {me}: moved to SHIP" in done.stdout, done.stdout
        gated.wait_until_done(mid)
        shown = http.get(f"/machines/{mid}", headers=admin).text  # its timeline says so
        assert f"override by {me}: hotfix" in shown
    made = gated.client.decisions(mid)
    assert [(d["actor"], d["via"], d["override"]) for d in made["decisions"]] == [
        ("alice", "api", False),
        (me, "cli", True),
    ]
    assert (made["gates"][0]["verdict"], made["gates"][0]["approvals"]) == ("approved", 1)
    last = [r for r in gated.client.history(mid) if r.event == "approval"][-1]
    assert (last.actor, last.reason) == (me, f"override by {me}: hotfix")


def test_an_approver_may_decide_only_at_their_groups_gates(gated: FsmEnv) -> None:
    with ScriptedAgent(gated) as agent, gated.api() as http:
        mid = gated.client.start_machine("test_gate", {}, agent_id=agent.id)
        gated.wait_for_gate(mid, "REVIEW")
        url = f"/api/machines/{mid}/decisions"
        body = {"decision": "approve", "fields": {"target": "staging"}}
        ops = http.post(url, headers={"Authorization": f"Bearer {DAVE}"}, json=body)
        assert ops.status_code == 403 and "dave may not decide at REVIEW" in ops.text
        bad = http.post(url, headers={"Authorization": f"Bearer {ALICE}"}, json={"decision": "ok"})
        assert bad.status_code == 422
        unfilled = http.post(
            url, headers={"Authorization": f"Bearer {ALICE}"}, json={"decision": "approve"}
        )
        assert unfilled.status_code == 422 and "target" in unfilled.text
        named = http.post(
            url, headers={"Authorization": f"Bearer {ALICE}"}, json={**body, "actor": "bob"}
        )
        assert named.status_code == 422 and "not as 'bob'" in named.text  # nobody else's vote
        herself = http.post(
            url, headers={"Authorization": f"Bearer {ALICE}"}, json={**body, "actor": "alice"}
        )
        assert herself.status_code == 200 and herself.json()["decision"]["approvals"] == 1
        shown = http.get(url, headers={"Authorization": f"Bearer {ALICE}"}).json()
        assert [d["actor"] for d in shown["decisions"]] == ["alice"]
        waiting = http.get("/api/approvals", headers={"Authorization": f"Bearer {CAROL}"})
        assert str(mid) in [w["machine_id"] for w in waiting.json()["items"]]
        gated.client.cancel(mid, "test")


def test_beat_escalates_a_silent_gate_and_its_silence_rejects(
    gated: FsmEnv, receiver_module: Receiver
) -> None:
    with ScriptedAgent(gated) as agent:
        mid = gated.client.start_machine("test_gate_fast", {}, agent_id=agent.id)
        info = gated.wait_until_done(mid, timeout=30)
    assert (info.status, info.current_state) == ("failed", "FAILED")
    visited = [(r.from_state, r.to_state, r.event) for r in gated.client.history(mid)]
    assert ("REVIEW", "ESCALATE", "timeout") in visited
    assert ("ESCALATE", "FAILED", "timeout") in visited
    asked = _wait_for(lambda: _approval_requests(receiver_module, str(mid)), 2)
    assert [a["state"] for a in asked] == ["REVIEW", "ESCALATE"]
    assert asked[0]["approvers"] == ["release"] and asked[1]["approvers"] == ["ops"]
    assert asked[0]["decideUrl"] == f"https://fsm.example.com/machines/{mid}#decide"
    assert list(agent.states()) == ["BUILD"]


def _approval_requests(receiver: Receiver, machine_id: str) -> list[dict[str, Any]]:
    found = []
    for headers, body in receiver.received:
        expected = "sha256=" + hmac.new(NOTIFY_SECRET.encode(), body, hashlib.sha256).hexdigest()
        assert headers["x-fsm-signature-256"] == expected
        message = json.loads(body)
        if message["type"] == "approval_waiting" and message["machineId"] == machine_id:
            assert headers["x-fsm-event"] == "machine.approval"
            found.append(message)
    return found


def _wait_for(read: Callable[[], list[Any]], count: int, timeout: float = 30.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    while len(found := read()) < count:
        if time.monotonic() > deadline:
            raise AssertionError(f"{len(found)} of {count} after {timeout}s: {found}")
        time.sleep(0.2)
    return found


def _comment(number: int, login: str, body: str, user_id: int | None = None) -> dict[str, Any]:
    """An `issue_comment` `created` delivery's payload, as GitHub documents it; its author is
    GitHub's account 2 (erin's) when their login is monalisa's, else account 9."""
    user_id = user_id or (2 if login.lower() == "monalisa" else 9)
    payload = issues_event("opened", number)
    del payload["sender"]
    comment_id = 2_000_000 + number
    return {
        "action": "created",
        "issue": payload["issue"],
        "comment": {
            "id": comment_id,
            "html_url": f"https://github.com/{REPO}/issues/{number}#issuecomment-{comment_id}",
            "body": body,
            "user": user(login, user_id),
            "author_association": "MEMBER",
            "created_at": "2024-04-22T14:00:00Z",
        },
        "repository": payload["repository"],
        "sender": user(login, user_id),
    }


def test_an_approvers_github_comment_decides_once_at_the_issues_gate(gated: FsmEnv) -> None:
    number = 4242
    with ScriptedAgent(gated, agent_id="tester") as agent, gated.api() as http:
        started = send(http, "issues", issues_event("assigned", number, assignee="monalisa"))
        mid = started.json()["machine_id"]
        _wait_for(lambda: gated.client.decisions(mid)["gates"], 1)  # REVIEW entered, gate open
        stranger = send(
            http, "issue_comment", _comment(number, "octocat", "/approve target=staging")
        )
        assert stranger.json()["outcome"] == "ignored" and "octocat" in stranger.json()["detail"]
        chatter = send(http, "issue_comment", _comment(number, "monalisa", "looks good to me"))
        assert chatter.json()["outcome"] == "ignored"
        unfilled = send(http, "issue_comment", _comment(number, "monalisa", "/approve lgtm"))
        assert unfilled.status_code == 422 and "target" in unfilled.json()["detail"]
        delivery = new_delivery()
        comment = _comment(number, "MonaLisa", "/approve target=staging staging looks right")
        decided = send(http, "issue_comment", comment, delivery)
        assert decided.json()["outcome"] == "decided", decided.text
        again = send(http, "issue_comment", comment, delivery)  # GitHub redelivers it
        assert again.json()["outcome"] == "duplicate"
        [made] = gated.client.decisions(mid)["decisions"]
        assert (made["actor"], made["via"], made["fields"], made["comment"]) == (
            "erin",
            "github",
            {"target": "staging"},
            "staging looks right",
        )
        release = Authority(admin=False, groups=frozenset({"release"}))
        gated.client.decide(
            mid, "approve", "carol", fields={"target": "staging"}, authority=release
        )
        info = gated.wait_until_done(mid)
    assert info.status == "completed"
    assert list(agent.states()) == ["BUILD", "SHIP"]


def test_a_github_comment_decides_as_the_account_it_is_never_as_the_login_it_shows(
    gated: FsmEnv,
) -> None:
    number = 4243
    with ScriptedAgent(gated, agent_id="tester"), gated.api() as http:
        started = send(http, "issues", issues_event("assigned", number, assignee="monalisa"))
        mid = started.json()["machine_id"]
        _wait_for(lambda: gated.client.decisions(mid)["gates"], 1)  # the gate is open
        approve = "/approve target=staging"
        taken = send(http, "issue_comment", _comment(number, "monalisa", approve, user_id=77))
        assert taken.json()["outcome"] == "ignored", taken.text  # erin's old login, re-registered
        assert "77" in taken.json()["detail"]
        assert gated.client.decisions(mid)["decisions"] == []
        renamed = send(http, "issue_comment", _comment(number, "mona-2", approve, user_id=2))
        assert renamed.json()["outcome"] == "decided", renamed.text  # erin, renamed
        [made] = gated.client.decisions(mid)["decisions"]
        assert (made["actor"], made["via"]) == ("erin", "github")
        gated.client.cancel(mid, "ops", "the test is over")
