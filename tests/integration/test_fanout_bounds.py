"""Issue 37, point 1, on a running deployment (worker and bridge, in both modes): a planning
agent's answer that plans 400 MB of children's contexts (1,000 sub-questions and a 400 KB
query each child starts with) fails its map state alone, writing no child, while an honest
agent's answer sent at the same moment is applied and its next task comes."""

from __future__ import annotations

import threading

from tests.support.agents import ScriptedAgent
from tests.support.messages import Reply
from tests.support.processes import FsmEnv

ATTACK = Reply(output={"subQuestions": [f"q{i}" for i in range(1000)], "query": "x" * 400_000})


def test_an_answer_planning_past_the_bound_fails_alone_and_an_honest_agent_goes_on(
    fsm: FsmEnv,
) -> None:
    together = threading.Event()  # both answers held, then sent at once
    with (
        ScriptedAgent(fsm, {"PLANNING": [ATTACK]}, gate=together) as hostile,
        ScriptedAgent(fsm, gate=together) as honest,
    ):
        attacked = fsm.client.start_machine("research_fanout", {"query": "q"}, agent_id=hostile.id)
        hostile.wait_for_tasks(1)
        mid = fsm.client.start_machine("test_pair", {}, agent_id=honest.id)
        honest.wait_for_tasks(1)
        together.set()
        second = honest.wait_for_tasks(2, timeout=60)  # its next task came
        assert (second["machineId"], second["state"]) == (str(mid), "SECOND")
        assert fsm.wait_until_done(mid, timeout=60).status == "completed"
        refused = fsm.wait_until_done(attacked, timeout=60)
    assert (refused.status, refused.current_state) == ("failed", "FAILED")
    assert "over FSM_MAX_FANOUT_BYTES=67108864" in (refused.error or "")
    assert fsm.client.children(attacked) == []
