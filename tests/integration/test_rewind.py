"""Rewind on real processes (a Celery worker with beat, the ack bridge): through the HTTP API and
the CLI, a machine goes back to a past step with that step's context and edits, its agent gets
the state again, and the abandoned attempt's late ack is refused and recorded."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable, Iterator

import pytest

from tests.support import ROOT
from tests.support.agents import ScriptedAgent
from tests.support.credentials import ADMIN_TOKEN
from tests.support.messages import SILENT, Reply
from tests.support.processes import FsmEnv


@pytest.fixture(scope="module")
def rewinding(env_factory: Callable[..., FsmEnv]) -> Iterator[FsmEnv]:
    env = env_factory("rewind")
    env.start_worker(beat=True)
    env.start_bridge()
    yield env


def test_rewind_through_the_api_and_the_cli(rewinding: FsmEnv) -> None:
    env = rewinding
    script = {
        "ONE": [Reply(output={"one": 1, "plan": "a"})],
        "TWO": [Reply(output={"two": 2, "plan": "b"}), Reply(output={"two": 22})],
        "THREE": [SILENT, Reply(output={"three": 3})],  # the first THREE never answers
    }
    admin = {"Authorization": f"Bearer {ADMIN_TOKEN}"}
    with ScriptedAgent(env, script) as agent, env.api() as http:
        mid = env.client.start_machine("test_linear", {}, agent_id=agent.id)
        env.wait_for_state(mid, "THREE")
        answer = http.post(
            f"/api/machines/{mid}/rewind",
            json={"step": 1, "set": {"plan": "c"}, "reason": "plan b was wrong"},
            headers=admin,
        )
        assert answer.status_code == 200, answer.text
        assert answer.json()["step"] == 3  # its own row's step: the attempt it interrupted
        assert env.wait_until_done(mid).status == "completed"  # TWO and THREE again
        refused = http.post(f"/api/machines/{mid}/rewind", json={"step": 99}, headers=admin)
        assert refused.status_code == 409 and "not in its past" in refused.text
        # steps: 0 start, 1 ONE, 2 TWO, 3 the rewind, 4 TWO again, 5 THREE (DONE)
        argv = [sys.executable, "-m", "fsm_celery", "rewind", str(mid), "--to", "4"]
        argv += ["--set", "retried=true", "--reason", "once more", "--actor", "ops"]
        done = subprocess.run(argv, env=env.env, cwd=ROOT, capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr
        info = env.wait_until_done(mid)
        [written] = [h for h in env.client.history(mid) if h.reason == "to step 4: once more"]
        assert done.stdout.split()[-2:] == ["step", str(written.attempt)]  # the row it wrote
        argv = [sys.executable, "-m", "fsm_celery", "fork", str(mid), "--from", "1"]
        argv += ["--set", "plan=d", "--reason", "try plan d beside it", "--actor", "ops"]
        forked = subprocess.run(argv, env=env.env, cwd=ROOT, capture_output=True, text=True)
        assert forked.returncode == 0, forked.stdout + forked.stderr
        fork_id = forked.stdout.strip()
        fork_info = env.wait_until_done(fork_id)  # type: ignore[arg-type]
        status = _cli(env, "status", fork_id[:8])
        assert f"forked_from    {mid}" in status and "forked_at      1" in status
        shown_history = _cli(env, "history", fork_id[:8]).splitlines()
        assert shown_history[0] == f"steps 0-1 inherited from {mid}:"
        assert "this fork's own steps:" in shown_history
        inherited = shown_history[: shown_history.index("this fork's own steps:")]
        assert any("ONE" in line and "->" in line for line in inherited)  # the source's step 1
        as_json = json.loads(_cli(env, "history", fork_id[:8], "--json"))
        assert [(r["attempt"], r.get("inherited_from")) for r in as_json[:2]] == [
            (0, str(mid)),
            (1, str(mid)),
        ]
        assert "inherited_from" not in as_json[2]
        shown = http.get(f"/api/machines/{mid}", headers=admin).json()
        assert [f["id"] for f in shown["forks"]] == [fork_id]
        page = http.get(f"/machines/{fork_id}", headers=admin)
        assert "forked from" in page.text and str(mid)[:8] in page.text
    assert fork_info.status == "completed" and fork_info.context["plan"] == "d"
    assert (str(fork_info.forked_from), fork_info.forked_at) == (str(mid), 1)
    assert info.status == "completed"
    history = env.client.history(mid)
    rewinds = [h for h in history if h.event == "rewind"]
    assert [(h.actor, h.reason) for h in rewinds] == [
        ("admin", "to step 1: plan b was wrong"),
        ("ops", "to step 4: once more"),
    ]
    assert info.context["plan"] == "c" and info.context["retried"] is True
    assert info.context["two"] == 22
    states = [t["state"] for t in agent.tasks]
    assert states == ["ONE", "TWO", "THREE", "TWO", "THREE", "THREE", "TWO", "THREE"]


def _cli(env: FsmEnv, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fsm_celery", *args],
        env=env.env,
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout
