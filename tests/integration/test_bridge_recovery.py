"""Acceptance: the ack bridge's reconnect delay starts again after each outage. A delay grown in
one Redis outage must not carry into the next: after the second restart the bridge waits its
first delay again (read from what it logs, not timed: a loaded machine times anything)."""

from __future__ import annotations

import json
import re
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from fsm_celery.core.messages import agent_ack_stream
from tests.support.processes import FsmEnv, Proc
from tests.support.services import start_redis, stop_redis

LONG, SHORT = 2.5, 0.3  # the first grows the delay to seconds (0.1, 0.2, 0.4, 0.8, 1.6, 3.2)
FIRST_DELAY = 0.1
FIX_BUG = {"projectName": "sla-api", "githubIssue": 7}
DELAY = re.compile(r"(\S+) (?:lost Redis .*; reconnecting|failed; restarting it) in ([\d.]+)s")


class Restartable:
    """A persistent redis-server of the test's own, stopped and started on the same port."""

    def __init__(self, directory: Path) -> None:
        self.directory = directory
        self.process, self.port = start_redis(directory, "--appendonly", "yes")

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def restart(self, down: float) -> float:
        """Stop it, wait, start it again; when it answered (monotonic)."""
        self.process.kill()
        self.process.wait(10)
        time.sleep(down)
        self.process, _ = start_redis(self.directory, "--appendonly", "yes", port=self.port)
        return time.monotonic()

    def stop(self) -> None:
        stop_redis(self.process)


@pytest.fixture(scope="module")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Restartable]:
    server = Restartable(tmp_path_factory.mktemp("redis-restarts"))
    yield server
    server.stop()


@pytest.fixture(scope="module")
def bridged(
    env_factory: Callable[..., FsmEnv], redis_server: Restartable
) -> Iterator[tuple[FsmEnv, Proc]]:
    # Inline: the bridge alone applies what it reads, so the gap measured is the bridge's own
    # (test_faults.py restarts Redis under both modes, with workers).
    env = env_factory("recovery", redis_url=redis_server.url, transition_mode="inline")
    bridge = env.start_bridge()
    yield env, bridge
    env.stop_all()


AGENT = str(uuid.uuid4())  # one agent, so its stream is known to the bridge before the outages


def _seen_after(env: FsmEnv, since: float, mark: int) -> float:
    """Report the agent (its `running` count set to mark) through its ack stream; the seconds
    from `since` until the bridge recorded it."""
    status = {
        "type": "agent_status",
        "agentId": AGENT,
        "agentType": "tester",
        "status": "active",
        "concurrency": 100,
        "running": mark,
    }
    stream = agent_ack_stream(AGENT, env.settings.channel_prefix)
    deadline = time.monotonic() + 30
    sent = False
    while time.monotonic() < deadline:
        if not sent:
            try:
                env.redis.xadd(stream, {"message": json.dumps(status)})
                sent = True
            except redis.ConnectionError:  # the test's own client reconnecting
                time.sleep(0.05)
                continue
        if any(a["id"] == AGENT and a["running"] == mark for a in env.client.agents()):
            return time.monotonic() - since
        time.sleep(0.05)
    raise AssertionError("the bridge never came back")


def _first_delays(log: str) -> dict[str, float]:
    """Each consumer's first reconnect delay in this part of the bridge's log."""
    firsts: dict[str, float] = {}
    for consumer, delay in DELAY.findall(log):
        firsts.setdefault(consumer, float(delay))
    return firsts


def test_the_reconnect_delay_starts_again_after_each_outage(
    bridged: tuple[FsmEnv, Proc], redis_server: Restartable
) -> None:
    env, bridge = bridged
    _seen_after(env, time.monotonic(), 0)  # the bridge serves, and knows the stream
    _seen_after(env, redis_server.restart(LONG), 1)
    grown = [float(d) for _, d in DELAY.findall(bridge.log.read_text())]
    assert max(grown) > FIRST_DELAY * 4, f"the long outage did not grow the delay: {grown}"
    before = len(bridge.log.read_text())
    _seen_after(env, redis_server.restart(SHORT), 2)
    # Carried over, the short outage would be waited out with the long one's grown delay (3.2 s
    # or more); started again, each consumer retries after 0.1 s first.
    firsts = _first_delays(bridge.log.read_text()[before:])
    assert firsts and set(firsts.values()) == {FIRST_DELAY}, firsts


def test_an_agent_blocked_on_its_stream_outlives_a_flushall(
    env_factory: Callable[..., FsmEnv], tmp_path: Path
) -> None:
    """FLUSHALL deletes the streams an SDK agent is blocked reading (XREADGROUP ... BLOCK):
    Redis answers UNBLOCKED, then NOGROUP. The agent sets its groups up again and serves on:
    it neither dies nor exits 0 (the soak, bench/soak.py, found it did)."""
    own = Restartable(tmp_path)
    try:
        env = env_factory("flushed_agent", redis_url=own.url, transition_mode="inline")
        env.start_worker()
        env.start_bridge()
        agent = env.start_agent("--mock", "--agent-type", "cto", "--think", "0")
        env.wait_for_agents(1)
        first = env.client.start_machine("cto_fix_bug", FIX_BUG)
        assert env.wait_until_done(first, timeout=60).status == "completed"
        client = redis.Redis.from_url(own.url)
        deadline = time.monotonic() + 30
        while not any(c["cmd"] == "xreadgroup" and "b" in c["flags"] for c in client.client_list()):
            assert time.monotonic() < deadline, "the agent never blocked on its stream"
            time.sleep(0.05)
        client.flushall()
        env.wait_for_agents(1)  # its status reports come again
        second = env.client.start_machine("cto_fix_bug", FIX_BUG)
        assert env.wait_until_done(second, timeout=60).status == "completed"
        assert agent.popen.poll() is None, f"the agent exited: see {agent.log}"
    finally:
        own.stop()
