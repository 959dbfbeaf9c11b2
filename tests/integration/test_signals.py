"""Outside events on real processes (a Celery worker with beat, the ack bridge, the HTTP app):
GitHub's merged pull request and finished checks delivered to the machines waiting for them,
an event early for its machine kept and consumed, a redelivery applied once; events sent through
the API (an admin's token, or signed with the type's secret) and the CLI."""

from __future__ import annotations

import hashlib
import hmac
import json
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fsm_celery import wiring
from tests.integration.test_github_webhook import REPO, issues_event, new_delivery, send, user
from tests.support import ROOT
from tests.support.agents import ScriptedAgent
from tests.support.credentials import ADMIN_TOKEN
from tests.support.messages import Reply
from tests.support.processes import FsmEnv

EVENT_SECRET = "test-wait-event-secret-9c1e7b3a5d2f4e6a8b0c"


@pytest.fixture(scope="module")
def waiting(env_factory: Callable[..., FsmEnv]) -> Iterator[FsmEnv]:
    env = env_factory(
        "signals",
        transition_mode="inline",
        github_build_type="test_wait",
        event_secrets={"test_wait": EVENT_SECRET},
    )
    env.start_worker(beat=True)
    env.start_bridge()
    yield env


def _merged(number: int, closes: int, merged: bool = True) -> dict[str, Any]:
    """A `pull_request` `closed` delivery's payload, as GitHub documents it."""
    repository = issues_event("opened", closes)["repository"]
    return {
        "action": "closed",
        "number": number,
        "pull_request": {
            "url": f"https://api.github.com/repos/{REPO}/pulls/{number}",
            "html_url": f"https://github.com/{REPO}/pull/{number}",
            "number": number,
            "state": "closed",
            "title": "Correct the spelling of commit",
            "body": f"It was spelled with two t's.\n\nFixes #{closes}",
            "merged": merged,
            "merge_commit_sha": "e5bd3914e2e596debea16f433f57875b5b90bcd6" if merged else None,
            "merged_by": user("monalisa", 2) if merged else None,
            "head": {"ref": "fix-spelling", "sha": "6dcb09b5b57875f334f61aebed695e2e4193db5e"},
            "base": {"ref": "main", "sha": "9049f1265b7d61be4a8904a9a27120d2064dab3b"},
        },
        "repository": repository,
        "sender": user("monalisa", 2),
    }


def _checks(branch: str, conclusion: str) -> dict[str, Any]:
    """A `check_suite` `completed` delivery's payload."""
    return {
        "action": "completed",
        "check_suite": {
            "id": 118578147,
            "head_branch": branch,
            "head_sha": "ec26c3e57ca3a959ca5aad62de7213c562f8c821",
            "status": "completed",
            "conclusion": conclusion,
            "url": f"https://api.github.com/repos/{REPO}/check-suites/118578147",
            "app": {"id": 29310, "slug": "octoapps", "name": "Octocat App"},
        },
        "repository": issues_event("opened", 1)["repository"],
        "sender": user("octocat"),
    }


def _workflow_run(branch: str, head_repository: dict[str, Any]) -> dict[str, Any]:
    """A `workflow_run` `completed` delivery's payload: a green run on the head branch, whose
    code comes from head_repository (a fork's, for a fork's pull request)."""
    repository = issues_event("opened", 1)["repository"]
    return {
        "action": "completed",
        "workflow_run": {
            "id": 30433642,
            "name": "Build",
            "head_branch": branch,
            "head_sha": "acb5820ced9479c074f688cc328bf03f341a511d",
            "event": "pull_request",
            "status": "completed",
            "conclusion": "success",
            "html_url": f"https://github.com/{REPO}/actions/runs/30433642",
            "pull_requests": [],
            "repository": repository,
            "head_repository": head_repository,
        },
        "repository": repository,
        "sender": user("octocat"),
    }


def signed_headers(
    path: str, body: bytes, *, secret: str = EVENT_SECRET, at: float | None = None
) -> dict[str, str]:
    """The headers of a signed event as docs/events.md says to sign one: the HMAC-SHA256 of
    timestamp, method, path and body, one a line."""
    stamp = str(int(time.time() if at is None else at))
    text = f"{stamp}\nPOST\n{path}\n".encode() + body
    digest = hmac.new(secret.encode(), text, hashlib.sha256).hexdigest()
    return {
        "content-type": "application/json",
        "x-fsm-timestamp": stamp,
        "x-fsm-signature-256": f"sha256={digest}",
    }


def _signals(env: FsmEnv, machine_id: Any) -> int:
    return [h.event for h in env.client.history(machine_id)].count("signal")


def test_a_merged_pull_request_moves_the_issues_machine_once(waiting: FsmEnv) -> None:
    number = 5150
    with ScriptedAgent(waiting, agent_id="tester") as agent, waiting.api() as http:
        started = send(http, "issues", issues_event("assigned", number, assignee="monalisa"))
        mid = started.json()["machine_id"]
        waiting.wait_for_state(mid, "WAIT_MERGE")
        unmerged = send(http, "pull_request", _merged(77, number, merged=False))
        assert unmerged.json()["outcome"] == "ignored"
        delivery = new_delivery()
        first = send(http, "pull_request", _merged(78, number), delivery)
        assert first.json()["outcome"] == "signalled", first.text
        again = send(http, "pull_request", _merged(78, number), delivery)  # redelivered
        assert "applied" not in again.json()["detail"]  # a duplicate, or past waiting
        info = waiting.wait_until_done(mid)
    assert info.status == "completed" and info.context["mergeCommitSha"].startswith("e5bd39")
    assert _signals(waiting, mid) == 1
    assert list(agent.states()) == ["BUILD", "DEPLOY"]


def test_a_merge_before_the_machine_waits_is_kept_and_consumed_when_it_does(
    waiting: FsmEnv,
) -> None:
    number = 5151
    hold = threading.Event()  # the agent's BUILD ack waits until the pull request is merged
    with ScriptedAgent(waiting, agent_id="tester", gate=hold) as agent, waiting.api() as http:
        started = send(http, "issues", issues_event("assigned", number, assignee="monalisa"))
        mid = started.json()["machine_id"]
        agent.wait_for_tasks(1)
        merged = send(http, "pull_request", _merged(79, number))
        assert "kept" in merged.json()["detail"], merged.text
        hold.set()
        info = waiting.wait_until_done(mid)
    assert info.status == "completed"
    [event] = waiting.client.events(mid)
    assert (event["outcome"], event["via"], event["name"]) == ("applied", "github", "pr_merged")
    assert [h.to_state for h in waiting.client.history(mid)] == [
        "BUILD",
        "WAIT_MERGE",
        "DEPLOY",
        "DONE",
    ]


def test_finished_checks_reach_the_machine_whose_branch_they_ran_on(waiting: FsmEnv) -> None:
    number = 5152
    script = {"PUSH": [Reply(output={"branch": "feature-5152"})]}
    with ScriptedAgent(waiting, script, agent_id="tester"), waiting.api() as http:
        waiting.client.load_definitions(str(ROOT / "tests" / "fixtures" / "definitions"))
        mid = waiting.client.start_machine("test_wait_ci", {})
        with waiting.client.engine.db.begin() as conn:  # as the webhook records its start
            from fsm_celery.store.tables import github_deliveries

            conn.execute(
                github_deliveries.insert().values(
                    id=new_delivery(),
                    event="issues",
                    action="assigned",
                    repository=REPO,
                    issue=number,
                    outcome="started",
                    machine_id=mid,
                )
            )
        waiting.wait_for_state(mid, "WAIT_CI")
        other = send(http, "check_suite", _checks("another-branch", "success"))
        assert other.json()["outcome"] == "ignored"
        done = send(http, "check_suite", _checks("feature-5152", "success"))
        assert done.json()["outcome"] == "signalled", done.text
        info = waiting.wait_until_done(mid)
    assert info.status == "completed" and info.context["conclusion"] == "success"


def _waiting_for_checks(env: FsmEnv, number: int) -> Any:
    """A test_wait_ci machine, as if the webhook started it for the issue, waiting for the
    checks of its branch feature-<number>."""
    mid = env.client.start_machine("test_wait_ci", {})
    with env.client.engine.db.begin() as conn:  # as the webhook records its start
        from fsm_celery.store.tables import github_deliveries

        conn.execute(
            github_deliveries.insert().values(
                id=new_delivery(),
                event="issues",
                action="assigned",
                repository=REPO,
                issue=number,
                outcome="started",
                machine_id=mid,
            )
        )
    env.wait_for_state(mid, "WAIT_CI")
    return mid


FORK = {"id": 999_001, "name": "hello-world", "full_name": "mallory/hello-world"}


def test_a_forks_run_on_a_branch_of_the_same_name_moves_no_machine(waiting: FsmEnv) -> None:
    number = 5153
    script = {"PUSH": [Reply(output={"branch": "feature-5153"})]}
    with ScriptedAgent(waiting, script, agent_id="tester"), waiting.api() as http:
        mid = _waiting_for_checks(waiting, number)
        forked = send(http, "workflow_run", _workflow_run("feature-5153", FORK))
        assert forked.json()["outcome"] == "ignored", forked.text
        assert "mallory/hello-world" in forked.json()["detail"]
        assert waiting.client.events(mid) == []
        assert waiting.client.get_machine(mid).current_state == "WAIT_CI"
        own = issues_event("opened", 1)["repository"]
        done = send(http, "workflow_run", _workflow_run("feature-5153", own))
        assert done.json()["outcome"] == "signalled", done.text
        info = waiting.wait_until_done(mid)
    assert info.status == "completed" and info.context["headRepository"] == REPO


def test_with_fork_heads_allowed_a_forks_run_moves_the_machine_of_its_branch(
    waiting: FsmEnv,
) -> None:
    number = 5154
    script = {"PUSH": [Reply(output={"branch": "feature-5154"})]}
    allowed = wiring.client(waiting.settings.model_copy(update={"github_fork_heads": True}))
    with ScriptedAgent(waiting, script, agent_id="tester"):
        mid = _waiting_for_checks(waiting, number)
        payload = _workflow_run("feature-5154", FORK)
        done = allowed.github_delivery(new_delivery(), "workflow_run", payload)
        assert done.outcome == "signalled", done.detail
        info = waiting.wait_until_done(mid)
    assert info.context["headRepository"] == "mallory/hello-world"


def test_events_through_the_api_signed_or_an_admins_and_the_cli(waiting: FsmEnv) -> None:
    with ScriptedAgent(waiting) as agent, waiting.api() as http:
        mid = waiting.client.start_machine("test_wait", {}, agent_id=agent.id)
        waiting.wait_for_state(mid, "WAIT_MERGE")
        admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
        page = http.get(f"/machines/{mid}", headers=admin)
        assert page.status_code == 200 and "Waiting for a pr_merged event" in page.text
        url = f"/api/machines/{mid}/events/pr_merged"
        body = json.dumps({"payload": {"merged": False}, "key": "ci-run-1"}).encode()
        unsigned = http.post(url, content=body, headers={"content-type": "application/json"})
        assert unsigned.status_code == 401
        forged = signed_headers(url, body, secret="not the secret")
        refused = http.post(url, content=body, headers=forged)
        assert refused.status_code == 403
        signed = http.post(url, content=body, headers=signed_headers(url, body))
        assert signed.status_code == 200, signed.text
        assert (signed.json()["event"]["outcome"], signed.json()["event"]["moved_to"]) == (
            "applied",
            "BUILD",
        )
        unknown = http.post(f"/api/machines/{mid}/events/deployed", json={}, headers=admin)
        assert unknown.status_code == 422 and "waits for no 'deployed' event" in unknown.text
        unfit = http.post(url, json={"payload": {"merged": "yes"}}, headers=admin)
        assert unfit.status_code == 422 and "merged" in unfit.text
        waiting.wait_for_state(mid, "WAIT_MERGE")  # BUILD again, acked by the agent
        argv = [sys.executable, "-m", "fsm_celery", "send-event", str(mid), "pr_merged"]
        argv += ["--payload", '{"merged": true}', "--actor", "release-bot"]
        sent = subprocess.run(argv, env=waiting.env, cwd=ROOT, capture_output=True, text=True)
        assert sent.returncode == 0 and "applied" in sent.stdout, sent.stdout + sent.stderr
        info = waiting.wait_until_done(mid)
        shown = http.get(f"/api/machines/{mid}/events", headers=admin).json()["items"]
        page = http.get(f"/machines/{mid}", headers=admin)
        assert "Outside events" in page.text and "signed:test_wait" in page.text
        steps = http.get(f"/api/machines/{mid}/history?context=true", headers=admin).json()
        signalled = [s for s in steps["items"] if s["event"] == "signal"]
        assert [s["change"] for s in signalled] == [
            {"set": {"merged": False, "retryCount": 1}},  # its loop edge counted too
            {"set": {"merged": True}},
        ]
        assert steps["items"][-1]["context"]["merged"] is True
        first_signal = signalled[0]["attempt"]
        then = http.get(f"/api/machines/{mid}/context?step={first_signal}", headers=admin)
        assert then.json()["context"]["merged"] is False and then.json()["state"] == "BUILD"
        missing = http.get(f"/api/machines/{mid}/context?step=999", headers=admin)
        assert missing.status_code == 404 and "no step 999" in missing.text
    argv = [sys.executable, "-m", "fsm_celery", "history", str(mid), "--context"]
    shown_cli = subprocess.run(argv, env=waiting.env, cwd=ROOT, capture_output=True, text=True)
    assert shown_cli.returncode == 0 and "  + merged = true" in shown_cli.stdout
    argv = [sys.executable, "-m", "fsm_celery", "context", str(mid), "--step", "0"]
    start = subprocess.run(argv, env=waiting.env, cwd=ROOT, capture_output=True, text=True)
    assert json.loads(start.stdout)["context"] == {"retryCount": 0, "maxRetries": 3}
    assert info.status == "completed"
    assert [(e["sender"], e["via"], e["outcome"]) for e in shown] == [
        ("signed:test_wait", "api", "applied"),
        ("release-bot", "cli", "applied"),
    ]


def _waiting_machine(env: FsmEnv, agent: ScriptedAgent) -> Any:
    mid = env.client.start_machine("test_wait", {}, agent_id=agent.id)
    env.wait_for_state(mid, "WAIT_MERGE")
    return mid


def test_a_signature_acts_on_its_machine_and_event_only_within_the_window(
    waiting: FsmEnv,
) -> None:
    with ScriptedAgent(waiting) as agent, waiting.api() as http:
        mine, other = _waiting_machine(waiting, agent), _waiting_machine(waiting, agent)
        url = f"/api/machines/{mine}/events/pr_merged"
        body = json.dumps({"payload": {"merged": True}}).encode()
        headers = signed_headers(url, body)
        elsewhere = http.post(
            f"/api/machines/{other}/events/pr_merged", content=body, headers=headers
        )
        renamed = http.post(f"/api/machines/{mine}/events/deployed", content=body, headers=headers)
        assert (elsewhere.status_code, renamed.status_code) == (403, 403), renamed.text
        stale = http.post(
            url, content=body, headers=signed_headers(url, body, at=time.time() - 400)
        )
        assert stale.status_code == 403 and "FSM_EVENT_SIGNATURE_WINDOW_SECONDS" in stale.text
        body_only = hmac.new(EVENT_SECRET.encode(), body, hashlib.sha256).hexdigest()
        old_way = {"content-type": "application/json", "x-fsm-signature-256": f"sha256={body_only}"}
        assert http.post(url, content=body, headers=old_way).status_code == 403
        claimed = json.dumps({"payload": {"merged": True}, "sender": "release-bot"}).encode()
        named = http.post(url, content=claimed, headers=signed_headers(url, claimed))
        assert named.status_code == 422 and "sender" in named.text
        assert waiting.client.events(mine) == [] and waiting.client.events(other) == []
        signed = http.post(url, content=body, headers=headers)
        assert signed.json()["event"]["outcome"] == "applied", signed.text
        replayed = http.post(url, content=body, headers=headers)
        assert replayed.json()["event"]["outcome"] == "duplicate", replayed.text
        waiting.wait_until_done(mine)
    [event] = waiting.client.events(mine)
    assert (event["sender"], event["outcome"]) == ("signed:test_wait", "applied")
    assert waiting.client.history(mine)[2].actor == "signed:test_wait"
    assert waiting.client.events(other) == []
    assert waiting.client.get_machine(other).current_state == "WAIT_MERGE"


def test_a_badly_signed_event_tells_nothing_of_the_machine_or_its_type(waiting: FsmEnv) -> None:
    with ScriptedAgent(waiting) as agent, waiting.api() as http:
        real = _waiting_machine(waiting, agent)
        answers = []
        for mid in (real, uuid.uuid4()):
            url = f"/api/machines/{mid}/events/pr_merged"
            body = json.dumps({"payload": {"merged": True}}).encode()
            unsigned = http.post(url, content=body, headers={"content-type": "application/json"})
            forged = http.post(url, content=body, headers=signed_headers(url, body, secret="guess"))
            answers.append([(r.status_code, r.json()) for r in (unsigned, forged)])
        assert answers[0] == answers[1]
        assert [status for status, _ in answers[0]] == [401, 403]
        assert "test_wait" not in json.dumps(answers)
        stranger = uuid.uuid4()  # signed with the type's secret: a signer may learn it is none
        url = f"/api/machines/{stranger}/events/pr_merged"
        missing = http.post(url, content=b"{}", headers=signed_headers(url, b"{}"))
        assert missing.status_code == 404
    assert waiting.client.events(real) == []


def test_the_docs_openssl_example_signs_an_event_the_api_applies(waiting: FsmEnv) -> None:
    text = (ROOT / "docs" / "events.md").read_text()
    section = text[text.index("## Signing an event") :]
    script = section[section.index("```sh\n") + 6 : section.index("\n```", section.index("```sh"))]
    _, base = waiting.start_dashboard()
    with ScriptedAgent(waiting) as agent:
        mid = _waiting_machine(waiting, agent)
        env = {**waiting.env, "MACHINE_ID": str(mid), "SECRET": EVENT_SECRET, "FSM_URL": base}
        ran = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
        assert ran.returncode == 0, ran.stderr
        assert json.loads(ran.stdout)["event"]["outcome"] == "applied", ran.stdout
        waiting.wait_until_done(mid)
    [event] = waiting.client.events(mid)
    assert (event["sender"], event["key"]) == ("signed:test_wait", "ci-run-123")
