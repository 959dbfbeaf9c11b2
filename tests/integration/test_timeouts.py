"""Acceptance: a silent agent's state times out, is retried, then takes its failure edge."""

from __future__ import annotations

import itertools
from datetime import datetime, timedelta

from tests.integration.conftest import ONE_MODE
from tests.support.agents import ScriptedAgent
from tests.support.messages import SILENT, Reply
from tests.support.processes import FsmEnv


@ONE_MODE
def test_silent_state_times_out_is_retried_then_takes_its_failure_edge(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"WAIT": [SILENT, SILENT]}) as agent:
        mid = fsm.client.start_machine("test_timeout", {"who": "Godot"}, agent_id=agent.id)
        info = fsm.wait_until_done(mid, timeout=20)
    assert info.status == "completed"
    rows = [(r.event, r.from_state, r.to_state, r.success) for r in fsm.client.history(mid)]
    assert rows == [
        ("start", None, "WAIT", True),
        ("timeout", "WAIT", "WAIT", False),
        ("timeout", "WAIT", "FALLBACK", False),
        ("ack", "FALLBACK", "DONE", True),
    ]
    assert list(agent.states()) == ["WAIT", "WAIT", "FALLBACK"]
    assert agent.tasks[0]["prompt"] == "Wait for Godot."
    history = fsm.client.history(mid)
    assert history[1].error_message == "timed out (retry 1 of 1)"
    assert (history[1].duration_ms or 0) >= 1000


@ONE_MODE
def test_a_failed_attempt_is_retried_after_its_backoff(fsm: FsmEnv) -> None:
    script = {"SLOW_RETRY": [Reply(success=False, error="flaky"), Reply(success=False)]}
    with ScriptedAgent(fsm, script) as agent:
        mid = fsm.client.start_machine("test_backoff", {}, agent_id=agent.id)
        assert fsm.wait_until_done(mid, timeout=20).status == "completed"
    sent = [datetime.fromisoformat(t["deadline"]) - timedelta(seconds=30) for t in agent.tasks]
    first, second = [(b - a).total_seconds() for a, b in itertools.pairwise(sent)]
    assert 1 <= first < 1.9  # delay 1 s
    assert 2 <= second < 2.9  # then 1 s * rate 2
