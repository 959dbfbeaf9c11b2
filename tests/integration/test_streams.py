"""Acceptance: the durable path. Acks in the stream survive a stopped or crashed bridge, and an
agent that was down when its task was dispatched reads it from its stream."""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable, Iterator

import psutil
import pytest
import redis

from fsm_celery.acks.streams import GROUP
from fsm_celery.core.messages import ack_stream, task_stream
from tests.support.agents import ScriptedAgent
from tests.support.faults import wait_settled
from tests.support.messages import SILENT, Reply, ack_for
from tests.support.processes import FsmEnv


@pytest.fixture(scope="module")
def durable(env_factory: Callable[..., FsmEnv], mode: str) -> Iterator[FsmEnv]:
    env = env_factory(
        f"durable_{mode}",
        transition_mode=mode,
        stream_claim_idle_seconds=1.0,
        relay_timeout_seconds=1.0,
    )
    env.start_worker()
    yield env
    env.stop_all()


def _silent_everywhere(n: int) -> dict[str, list]:  # type: ignore[type-arg]
    return {"FIRST": [SILENT] * n, "SECOND": [SILENT] * n}


def _wait_all_in(env: FsmEnv, ids: list, state: str, timeout: float = 30) -> None:  # type: ignore[type-arg]
    deadline = time.monotonic() + timeout
    while True:
        states = [env.client.get_machine(mid).current_state for mid in ids]
        if states.count(state) == len(ids):
            return
        assert time.monotonic() < deadline, f"{states.count(state)}/{len(ids)} reached {state}"
        time.sleep(0.1)


def test_acks_sent_while_the_bridge_is_stopped_are_applied_once_it_starts(
    durable: FsmEnv, mode: str
) -> None:
    bridge = durable.start_bridge()
    with ScriptedAgent(durable, _silent_everywhere(100), via_stream=True) as agent:
        ids = [durable.client.start_machine("test_pair", {}, agent_id=agent.id) for _ in range(100)]
        agent.wait_for_tasks(100)
        bridge.stop()
        for task in list(agent.tasks):
            agent.send(ack_for(task))
        time.sleep(1)
        assert {durable.client.get_machine(mid).current_state for mid in ids} == {"FIRST"}
        durable.start_bridge()
        _wait_all_in(durable, ids, "SECOND")
    # Applied once. In the celery mode an ack whose worker settled it after the relay timeout
    # (1 s here; a loaded CI machine took longer for a burst of 100) is relayed again, and that
    # copy is refused as stale: the only rejection there may be.
    copies = {"stale_attempt"} if mode == "celery" else set()
    for mid in ids:
        attempts = [(r.attempt, r.event) for r in durable.client.history(mid)]
        assert attempts == [(0, "start"), (1, "ack")]
        assert {r["reason"] for r in durable.client.rejected(mid)} <= copies


def test_acks_a_crashed_bridge_had_read_are_claimed_by_the_next(durable: FsmEnv) -> None:
    durable.ensure_bridge()  # its consumer group on the stream (whatever ran before)
    stream = ack_stream(durable.settings.channel_prefix)
    with ScriptedAgent(durable, _silent_everywhere(20), via_stream=True) as agent:
        ids = [durable.client.start_machine("test_pair", {}, agent_id=agent.id) for _ in range(20)]
        agent.wait_for_tasks(20)
        for proc in durable.procs:
            if proc.name == "bridge":
                proc.stop()
        for task in list(agent.tasks):
            agent.send(ack_for(task))
        # What a bridge that died right after reading leaves behind: entries pending on a
        # consumer that will never XACK them.
        read = durable.redis.xreadgroup(GROUP, "dead-bridge", {stream: ">"}, count=100)
        assert len(read[0][1]) == 20
        assert durable.redis.xpending(stream, GROUP)["pending"] == 20
        durable.start_bridge()
        _wait_all_in(durable, ids, "SECOND")
    wait_settled(durable, stream)
    for mid in ids:
        assert [r.event for r in durable.client.history(mid)] == ["start", "ack"]


def test_an_agent_that_was_down_reads_its_task_from_its_stream(durable: FsmEnv) -> None:
    durable.ensure_bridge()
    agent_id = "8f4b3c1e-2a7d-4d51-9b1e-2f0c6a1d9e77"
    mid = durable.client.start_machine("test_pair", {}, agent_id=agent_id)
    time.sleep(0.5)  # dispatched while no agent listens: pub/sub drops it, the stream keeps it
    client = redis.Redis.from_url(durable.settings.redis_url)
    prefix = durable.settings.channel_prefix
    seen: list[str] = []
    last = "0"
    deadline = time.monotonic() + 20
    while durable.client.get_machine(mid).status == "running":
        assert time.monotonic() < deadline, "the machine did not finish"
        found = client.xread({task_stream(agent_id, prefix): last}, block=200)
        for entry_id, fields in found[0][1] if found else []:
            last = entry_id
            task = json.loads(fields[b"message"])
            seen.append(task["state"])
            client.xadd(ack_stream(prefix), {"message": json.dumps(ack_for(task))})
    assert seen == ["FIRST", "SECOND"]
    assert durable.client.get_machine(mid).status == "completed"


def test_a_message_the_database_refuses_is_rejected_and_its_batch_applied(
    durable: FsmEnv,
) -> None:
    bridge = durable.start_bridge()
    with ScriptedAgent(durable, _silent_everywhere(3), via_stream=True) as agent:
        ids = [durable.client.start_machine("test_pair", {}, agent_id=agent.id) for _ in range(3)]
        tasks = agent.wait_for_tasks(3)
        bridge.stop()  # so that the three acks are read as one batch
        by_machine = {t["machineId"]: t for t in agent.tasks}
        first, poisoned, last = (by_machine[str(mid)] for mid in ids)
        agent.send(ack_for(first))
        # Valid JSON and a valid ack, but PostgreSQL's jsonb cannot hold a NUL character.
        agent.send(ack_for(poisoned, Reply(output={"first": True, "log": "build\u0000failed"})))
        agent.send(ack_for(last))
        durable.start_bridge()
        _wait_all_in(durable, [ids[0], ids[2]], "SECOND")
        rejected = durable.wait_for_rejections(ids[1], 1)
    assert tasks
    assert [r["reason"] for r in rejected] == ["invalid_value"]
    assert "Unicode" in rejected[0]["detail"] or "\\u0000" in rejected[0]["detail"]
    assert "\\u0000" in rejected[0]["payload"]
    poisoned_machine = durable.client.get_machine(ids[1])
    assert (poisoned_machine.current_state, poisoned_machine.attempt) == ("FIRST", 1)
    assert [r.event for r in durable.client.history(ids[1])] == ["start"]
    wait_settled(durable, ack_stream(durable.settings.channel_prefix))


def test_a_bridge_process_that_dies_is_started_again(durable: FsmEnv) -> None:
    for proc in durable.procs:
        if proc.name == "bridge":
            proc.stop()
    bridge = durable.start_bridge(processes=2)
    parent = psutil.Process(bridge.popen.pid)

    def consumers() -> list[psutil.Process]:
        found = []
        for child in parent.children():
            with contextlib.suppress(psutil.Error):  # exited meanwhile
                if child.status() != psutil.STATUS_ZOMBIE and "spawn_main" in str(child.cmdline()):
                    found.append(child)
        return found

    deadline = time.monotonic() + 20
    while len(consumers()) != 1:
        assert time.monotonic() < deadline, "the second bridge process did not start"
        time.sleep(0.1)
    victim = consumers()[0]
    victim.kill()
    while not [p for p in consumers() if p.pid != victim.pid]:
        assert time.monotonic() < deadline + 20, "the killed bridge process was not replaced"
        time.sleep(0.1)
    with ScriptedAgent(durable, via_stream=True) as agent:
        mid = durable.client.start_machine("test_pair", {}, agent_id=agent.id)
        assert durable.wait_until_done(mid).status == "completed"
