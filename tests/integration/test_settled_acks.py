"""The celery mode's acks are settled on their streams only once a worker applied them: the
bridge relays a batch as an fsm.apply_acks task and leaves its entries pending; the worker
settles them after its commit; an entry left pending past FSM_RELAY_TIMEOUT_SECONDS is relayed
again (acks/settle.py, acks/streams.py). With real processes: a worker, an ack bridge, Redis as
Celery's broker.

The loss forced here is the one a Redis failover makes: kombu's Redis transport takes a task
in two commands (BRPOP, then its record as unacknowledged), and a primary killed between them
leaves a replica that holds neither the task nor its record. Taking the task off the broker's
list while no worker reads it is that window, made deterministic: the ack must be applied
within seconds, not at its state's deadline (300 s here, 10 minutes in cto_fix_bug)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterator

import pytest

from fsm_celery.acks.relay import APPLY_ACKS
from fsm_celery.acks.streams import GROUP
from fsm_celery.core.messages import agent_ack_stream
from fsm_celery.core.parking import CRASH_DELIVERIES, Policy
from tests.support.agents import ScriptedAgent
from tests.support.databases import records_refused
from tests.support.faults import wait_settled
from tests.support.messages import SILENT, ack_for
from tests.support.processes import FsmEnv, Proc

RELAY_TIMEOUT = 1.0  # seconds an entry may wait for its worker before it is relayed again


@pytest.fixture(scope="module")
def settled(env_factory: Callable[..., FsmEnv]) -> Iterator[FsmEnv]:
    env = env_factory("settled", transition_mode="celery", relay_timeout_seconds=RELAY_TIMEOUT)
    env.start_bridge()
    yield env
    env.stop_all()


def _worker(env: FsmEnv) -> Proc:
    return env.start_worker(supervised=False)


def _take_apply_acks_task(env: FsmEnv, timeout: float = 30) -> dict[str, object]:
    """Take the fsm.apply_acks task off the broker's list as a BRPOP would, with no record of
    it kept (what the promoted replica of a failover has): the task the bridge relayed."""
    queue = env.settings.queue
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for raw in env.redis.lrange(queue, 0, -1):
            message = json.loads(raw)
            if message["headers"]["task"] == APPLY_ACKS and env.redis.lrem(queue, 1, raw):
                return dict(message)
        time.sleep(0.05)
    raise AssertionError("the bridge relayed no fsm.apply_acks task")


def _pending(env: FsmEnv, stream: str) -> int:
    return int(env.redis.xpending(stream, GROUP)["pending"])


def test_an_ack_whose_task_the_broker_lost_is_applied_in_seconds_not_at_the_deadline(
    settled: FsmEnv,
) -> None:
    worker = _worker(settled)
    with ScriptedAgent(
        settled, {"FIRST": [SILENT], "SECOND": [SILENT]}, own_stream=True
    ) as agent:  # SECOND unanswered: the history ends there
        mid = settled.client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        worker.stop()  # nobody takes the relayed task: the test takes it, and keeps nothing
        stream = agent_ack_stream(agent.id, settled.settings.channel_prefix)
        agent.send(ack_for(task))
        lost = _take_apply_acks_task(settled)
        assert mid.hex in lost["headers"]["argsrepr"].replace("-", "")  # type: ignore[index]
        assert _pending(settled, stream) == 1  # relayed, not settled: no worker applied it
        _worker(settled)
        settled.wait_for_state(mid, "SECOND", timeout=60)  # the state's deadline is 300 s
    history = [(r.attempt, r.event, r.to_state) for r in settled.client.history(mid)]
    assert history == [(0, "start", "FIRST"), (1, "ack", "SECOND")]  # no timeout, no retry
    wait_settled(settled, stream)


def test_a_worker_settles_what_it_applied_and_the_bridge_relays_nothing_again(
    settled: FsmEnv,
) -> None:
    settled.ensure_worker()
    with ScriptedAgent(settled, {}, own_stream=True) as agent:
        ids = [settled.client.start_machine("test_pair", {}, agent_id=agent.id) for _ in range(20)]
        for mid in ids:
            assert settled.wait_until_done(mid, timeout=60).status == "completed"
        wait_settled(settled, agent_ack_stream(agent.id, settled.settings.channel_prefix))
    for mid in ids:
        assert [r.event for r in settled.client.history(mid)] == ["start", "ack", "ack"]


def test_an_entry_relayed_many_times_and_never_applied_is_parked_as_such(
    settled: FsmEnv,
) -> None:
    """What the dead-letter policy counts in the celery mode is the relays: an entry relayed
    CRASH_DELIVERIES times that no worker ever settled (each took it down, say) is parked."""
    for proc in settled.procs:
        if proc.name == "worker":
            proc.stop()
    marker = f"relayed-{uuid.uuid4().hex}"
    agent = uuid.uuid4()
    stream = agent_ack_stream(str(agent), settled.settings.channel_prefix)
    settled.redis.xadd(stream, {"message": json.dumps({"type": "state_ack", "x": marker})})
    _take_apply_acks_task(settled)
    [(entry, _)] = settled.redis.xrange(stream)
    # what ten relays of it leave behind: its deliveries counted, long idle
    settled.redis.xclaim(
        stream, GROUP, "elsewhere", 0, [entry], idle=10**9, retrycount=CRASH_DELIVERIES
    )
    parked = _wait_for_parked(settled, marker)
    assert parked["reason"] == Policy.CRASHED and parked["source"] == stream
    wait_settled(settled, stream)


def test_a_message_given_up_on_is_parked_once_however_often_it_was_relayed(
    settled: FsmEnv,
) -> None:
    """A message the database refuses even to record is tried three times by its worker, a
    second apart, while the bridge relays it again every RELAY_TIMEOUT: each copy counts its
    own tries, and the first to give up parks it, once."""
    settled.ensure_worker()
    marker = f"unrecordable-{uuid.uuid4().hex}"
    with (
        records_refused(settled.client.engine.db, marker),  # it cannot even be recorded
        ScriptedAgent(settled, {"FIRST": [SILENT]}, own_stream=True) as agent,
    ):
        mid = settled.client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        agent.send('{"broken": "' + marker)  # malformed, and its rejection fails
        agent.send(ack_for(task))  # behind it on the same stream
        settled.wait_for_state(mid, "SECOND", timeout=60)
        parked = _wait_for_parked(settled, marker)
        bridge = next(p for p in settled.procs if p.name == "bridge")
        bridge.wait_for_log("relayed again")  # copies were made while it was tried
        time.sleep(3 * RELAY_TIMEOUT)  # the copies' own tries run out meanwhile
        assert len([p for p in settled.client.parked(1000) if marker in p["message"]]) == 1
        assert parked["reason"] == "could not be applied nor recorded 3 times"
        wait_settled(settled, agent_ack_stream(agent.id, settled.settings.channel_prefix))


def _wait_for_parked(env: FsmEnv, marker: str, timeout: float = 30) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = [p for p in env.client.parked(1000) if marker in p["message"]]
        if found:
            assert len(found) == 1, found
            return found[0]
        time.sleep(0.1)
    raise AssertionError("the message was never parked")
