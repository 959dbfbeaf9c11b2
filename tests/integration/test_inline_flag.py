"""`fsm-celery ack-bridge --inline` decides the transition mode once, for every part of the
bridge: started with the flag and no FSM_TRANSITION_MODE, beside a real worker, the bridge
enters the next states itself, those that follow a fan-out's child its own entry moved too,
and no fsm.enter_state task is sent for them."""

from __future__ import annotations

import re
from collections.abc import Callable

from fsm_celery.core.loader import parse_definition
from tests.support.agents import ScriptedAgent
from tests.support.processes import FsmEnv

# FIRST's ack moves the machine into a map whose one child cannot be sent (its prompt names a
# key its context lacks): the child fails as the bridge enters it, in a transaction of its
# own, and that moves the parent on to AFTER. Which process enters AFTER is the mode's choice.
UNSENDABLE_CHILD = {
    "type": "inline_flag",
    "agent_type": "tester",
    "initial_state": "FIRST",
    "states": [
        {"name": "FIRST", "prompt": "First.", "on_success": "EACH", "on_failure": "FAILED"},
        {
            "name": "EACH",
            "map": {
                "items": "context.items",
                "item_key": "item",
                "max_concurrency": 1,
                "initial_state": "WORK",
                "states": [
                    {"name": "WORK", "prompt": "{{ missing }}", "on_success": "DONE"}
                    | {"on_failure": "FAILED"},
                    {"name": "DONE", "terminal": "completed"},
                    {"name": "FAILED", "terminal": "failed"},
                ],
            },
            "on_success": "DONE",
            "on_failure": "AFTER",
        },
        {"name": "AFTER", "prompt": "After.", "on_success": "DONE", "on_failure": "FAILED"},
        {"name": "DONE", "terminal": "completed"},
        {"name": "FAILED", "terminal": "failed"},
    ],
}
ENTER_STATE = re.compile(r"Task fsm\.enter_state\[([0-9a-f-]+)\]")


def test_a_bridge_started_with_inline_enters_the_next_states_itself(
    env_factory: Callable[..., FsmEnv],
) -> None:
    env = env_factory("inline_flag")
    env.client.engine.catalog.load([parse_definition(UNSENDABLE_CHILD)])
    worker = env.start_worker()
    without_mode = {k: v for k, v in env.env.items() if k != "FSM_TRANSITION_MODE"}
    bridge = env.start_bridge(1, "--inline", env=without_mode)
    with ScriptedAgent(env) as agent:
        machine_id = env.client.start_machine("inline_flag", {"items": ["a"]}, agent_id=agent.id)
        assert env.wait_until_done(machine_id).status == "completed"
        assert [t["state"] for t in agent.tasks] == ["FIRST", "AFTER"]
    assert env.visited(machine_id) == ["FIRST", "EACH", "AFTER", "DONE"]
    bridge.wait_for_log("transition mode: inline")
    # one fsm.enter_state task: the one the client sent for FIRST; AFTER came from the bridge
    assert len(set(ENTER_STATE.findall(worker.log.read_text(errors="replace")))) == 1
