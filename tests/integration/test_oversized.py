"""Security finding 16: an agent writes an entry far over the payload limit on its own ack stream,
padded in a field other than `message`. The entry never reaches the bridge (its memory stays
flat) nor the read script (Redis answers everyone meanwhile): its stream, over the cap, is
dropped unread and recorded with its size, and the agent's next acks are applied. What the
read script loads per call is bounded by bytes of every field."""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import psutil
import pytest
import redis

from fsm_celery.acks.streams import _READ, GROUP, STREAM_CAP
from tests.support.agents import ScriptedAgent
from tests.support.messages import SILENT, ack_for
from tests.support.processes import FsmEnv

MB = 1024 * 1024
LIMIT = 65_536  # the deployment's payload limit


@pytest.fixture(scope="module")
def guarded(env_factory: Callable[..., FsmEnv]) -> Iterator[FsmEnv]:
    env = env_factory("oversized", transition_mode="inline", max_payload_bytes=LIMIT)
    env.start_worker()
    env.start_bridge()
    yield env
    env.stop_all()


def _rss(pid: int) -> int:
    return int(psutil.Process(pid).memory_info().rss)


def _parked_from(env: FsmEnv, stream: str, timeout: float = 30) -> dict[str, str]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for parked in env.client.parked(100):
            if parked["source"] == stream:
                return parked
        time.sleep(0.02)
    raise AssertionError(f"nothing from {stream} was parked")


def test_a_200_mb_entry_never_reaches_the_bridge_and_the_next_acks_are_applied(
    guarded: FsmEnv,
) -> None:
    bridge = next(p for p in guarded.procs if p.name == "bridge")
    script = {"FIRST": [SILENT]}
    with (
        ScriptedAgent(guarded, script, own_stream=True) as agent,
        ScriptedAgent(guarded, own_stream=True) as bystander,
    ):
        mid = guarded.client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        stream = f"{guarded.settings.channel_prefix}stream:state:ack:{agent.id}"
        before = _rss(bridge.popen.pid)
        pad = b"x" * (200 * MB)  # a small `message`, and 200 MB where the old script never looked
        # Count the commands from here on (scripts' too): before the entry, which the bridge
        # may drop the moment it is written.
        guarded.redis.config_resetstat()
        guarded.redis.xadd(stream, {"message": "{}", "pad": pad})  # Redis's own cost: seconds
        others = [
            guarded.client.start_machine("test_pair", {}, agent_id=bystander.id) for _ in range(3)
        ]
        parked = _parked_from(guarded, stream)
        agent.send(ack_for(task))  # the agent's next ack, on its stream made again
        peak = before
        deadline = time.monotonic() + 60
        for machine in [mid, *others]:
            while guarded.client.get_machine(machine).status != "completed":
                assert time.monotonic() < deadline, guarded.client.history(machine)
                peak = max(peak, _rss(bridge.popen.pid))
                time.sleep(0.02)
    assert parked["reason"].startswith("stream of "), parked
    assert int(parked["bytes"]) > 200 * MB, parked
    assert parked["reason"].endswith(f"over the cap of {STREAM_CAP}: dropped unread"), parked
    assert parked["message"] == ""  # its size, never its fields
    assert peak - before < 30 * MB, f"the bridge grew by {(peak - before) / MB:.0f} MB"
    # Nothing loads the entry: MEMORY USAGE measures the stream, UNLINK frees it off the main
    # thread (the old read, and a DEL, held every client 1.7 s for 16 x 32 MB). What ran is
    # asserted, not how long a PING waited (a loaded machine's figure, not the bridge's). The
    # read script is the only UNLINK on this Redis; a DEL is not counted against it: the
    # worker's kombu releases its unacked-restore mutex with one every few seconds.
    stats = guarded.redis.info("commandstats")
    assert stats.get("cmdstat_unlink", {}).get("calls", 0) >= 1, stats
    assert "cmdstat_xrange" not in stats, stats["cmdstat_xrange"]


@pytest.fixture()
def stream(guarded: FsmEnv) -> Iterator[tuple[redis.Redis, str, str]]:
    client = redis.Redis.from_url(guarded.settings.redis_url)
    key = f"script-{uuid.uuid4().hex}"
    client.xgroup_create(key, GROUP, id="0", mkstream=True)
    yield client, key, key + ":dead"
    client.delete(key, key + ":dead")
    client.close()


def _read(
    client: redis.Redis, keys: list[str], budget: int, mode: str = ">", cap: int = 64 * MB
) -> Any:
    args = (GROUP, "tester", mode, 500, budget, 1, LIMIT, cap)
    return client.register_script(_READ)(keys=keys, args=args)


def test_a_read_loads_at_most_its_budget_and_one_entry_alone(
    stream: tuple[redis.Redis, str, str],
) -> None:
    client, key, dead = stream
    big = [client.xadd(key, {"message": "{}", "pad": b"p" * (8 * MB)}) for _ in range(4)]
    small = [client.xadd(key, {"message": f'{{"n": {n}}}'}) for n in range(100)]
    calls = []
    while True:
        found, parked, touched = _read(client, [key, dead], budget=MB)
        calls.append((found, parked, touched))
        if not found and not parked:
            break
    # Each 8 MB entry, in a stream under the cap but too large for the budget, was loaded
    # alone in its own call, and parked by its id and size.
    assert [c[1] for c in calls[:4]] == [[1, i, 8 * MB + 12] for i in big]
    assert all(c[2] <= MB or (c[2] == 8 * MB + 12 and not c[0]) for c in calls), calls
    read = [entry for c in calls for entry in c[0][1::4]]
    assert read == small
    assert client.xlen(key) == 100  # the small ones stay for the bridge's XACK and XDEL
    assert [e[1][b"entryId"] for e in client.xrange(dead)] == big


def test_a_stream_that_fits_the_budget_is_read_in_chunks(
    stream: tuple[redis.Redis, str, str],
) -> None:
    client, key, dead = stream
    ids = [client.xadd(key, {"message": f'{{"n": {n}}}'}) for n in range(100)]
    found, parked, touched = _read(client, [key, dead], budget=MB)
    assert (found[1::4], parked) == (ids, [])
    assert touched == sum(len("message") + len(f'{{"n": {n}}}') for n in range(100))
    again, _, _ = _read(client, [key, dead], budget=MB, mode="0")  # pending, read again
    assert again[1::4] == ids and again[3::4] == [2] * 100


def test_padding_outside_the_message_counts_toward_the_limit(
    stream: tuple[redis.Redis, str, str],
) -> None:
    client, key, dead = stream
    fits = client.xadd(key, {"message": "m" * (LIMIT - 20), "pad": "p" * 5})
    over = client.xadd(key, {"message": "{}", "a": "p" * LIMIT})
    found, parked, _ = _read(client, [key, dead], budget=MB)
    assert found[1::4] == [fits]
    assert parked == [1, over, LIMIT + len("message{}a")]


def test_a_stream_over_the_cap_is_dropped_without_loading_an_entry(
    stream: tuple[redis.Redis, str, str],
) -> None:
    client, key, dead = stream
    client.xadd(key, {"message": "{}", "pad": b"p" * (4 * MB)})
    client.xadd(key, {"message": "{}"})
    found, parked, touched = _read(client, [key, dead], budget=MB, cap=2 * MB)
    assert (found, touched, parked[:2]) == ([], 0, [1, None])
    assert parked[2] > 4 * MB
    assert not client.exists(key)
    record = client.xrange(dead)[0][1]
    reason = f"stream of {parked[2]} bytes (2 entries), over the cap of {2 * MB}: dropped unread"
    assert record[b"reason"] == reason.encode()


def test_a_stream_gone_since_the_last_upkeep_is_passed_over(
    stream: tuple[redis.Redis, str, str],
) -> None:
    client, key, dead = stream
    ids = [client.xadd(key, {"message": "{}"}) for _ in range(3)]
    found, parked, _ = _read(client, [key + ":dropped", key, dead], budget=MB)
    assert (found[1::4], parked) == (ids, [])
