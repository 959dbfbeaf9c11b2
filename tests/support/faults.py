"""The fault tests' load (tests/integration/test_faults.py, test_postgres_restart.py): test_linear
machines driven by a ScriptedAgent, and what "nothing lost, nothing doubled" means for them."""

from __future__ import annotations

import time
from uuid import UUID

from fsm_celery.acks.streams import GROUP
from tests.support.agents import ScriptedAgent
from tests.support.processes import FsmEnv

LINEAR = ["ONE", "TWO", "THREE", "DONE"]


def start_many(env: FsmEnv, agent: ScriptedAgent, n: int) -> list[UUID]:
    return [env.client.start_machine("test_linear", {}, agent_id=agent.id) for _ in range(n)]


def wait_for_progress(agent: ScriptedAgent, tasks: int) -> None:
    deadline = time.monotonic() + 60
    while len(agent.tasks) < tasks:
        assert time.monotonic() < deadline, f"only {len(agent.tasks)} tasks dispatched"
        time.sleep(0.01)


def assert_each_finished_exactly_once(env: FsmEnv, ids: list[UUID]) -> None:
    for mid in ids:
        history = env.client.history(mid)
        assert [row.attempt for row in history] == list(range(len(history))), mid
        moved = [row.to_state for row in history if row.success]
        assert moved == LINEAR, f"{mid}: successful transitions {moved}"
        assert all(row.event in ("start", "ack", "timeout") for row in history)


def wait_settled(env: FsmEnv, stream: str, timeout: float = 60) -> None:
    """Until no entry of the ack stream is pending nor kept: in the celery mode the worker
    settles an entry right after its commit, a moment after its machine moved, and an entry a
    killed bridge held is relayed again after FSM_RELAY_TIMEOUT_SECONDS."""
    deadline = time.monotonic() + timeout
    while (pending := int(env.redis.xpending(stream, GROUP)["pending"])) or env.redis.xlen(stream):
        kept = env.redis.xlen(stream)
        assert time.monotonic() < deadline, f"{pending} entries pending, {kept} kept"
        time.sleep(0.1)
