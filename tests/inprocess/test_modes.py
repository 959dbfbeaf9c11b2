"""The transition mode, decided once where a process is built (fsm_celery.wiring): an ack
bridge started with --inline over settings in the celery mode applies acks and sends the next
state_tasks itself; the engine built for the celery mode hands every decided state on."""

from __future__ import annotations

import json

from fsm_celery import wiring
from fsm_celery.acks.consumer import Envelope
from fsm_celery.config import TransitionMode
from fsm_celery.engine import Inbound
from tests.inprocess.conftest import Fsm, ack


def test_a_bridge_started_inline_sends_the_next_state_task_itself(fsm: Fsm) -> None:
    assert fsm.settings.transition_mode is TransitionMode.CELERY
    inline = fsm.settings.model_copy(update={"transition_mode": TransitionMode.INLINE})
    engine = wiring.machine_engine(inline, clock=fsm.clock)  # as `ack-bridge --inline` builds it
    try:
        applier = wiring.inline_applier(inline, engine)
        agent = fsm.agent("tester")
        mid = fsm.start("test_linear")
        task = agent.task()
        assert applier([Envelope(Inbound(json.dumps(ack(task))), "test")]) == []
        [sent] = agent.tasks()  # from the bridge, in the ack's transaction: no task between
        assert (sent["machineId"], sent["state"], sent["attempt"]) == (str(mid), "TWO", 2)
    finally:
        engine.db.dispose()


def test_the_engine_built_for_the_celery_mode_hands_the_next_state_on(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_linear")
    task = agent.task()
    [step] = fsm.engine.inbox.apply([Inbound(json.dumps(ack(task)))])
    assert (step.machine_id, step.state, step.attempt) == (mid, "TWO", 2)
    assert agent.tasks() == []  # an fsm.enter_state task sends it
