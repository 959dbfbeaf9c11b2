"""Redis behind Sentinel: the primary killed (SIGKILL) mid-load, in both transition modes, with
real processes (one primary, one replica, three sentinels; a celery worker with beat, an ack
bridge, the mock agents), none of them restarted by hand nor supervised: every machine
completes on its one path, none is lost, no ack is applied twice. State_tasks and acks count as
sent once a replica holds them (FSM_REDIS_REPLICAS=1: Redis WAIT), so the promoted replica has
every one the engine and the agents counted as sent; what the old primary took after that is
sent again, and its copies are refused as stale. The old primary is brought back and the
sentinels make it a replica of the new one. The figures (the stall, the attempts and copies the
failover cost) are printed; docs/scaling.md records a run's.

The machines are cto_fix_bug as shipped, whose states wait 5 to 30 minutes for an answer: a
failover must cost no attempt. In the celery mode an ack reaches a worker as an fsm.apply_acks
task, and kombu's Redis transport pops a task (BRPOP), then records it as unacknowledged (a
second command): a primary killed between the two loses the task. Its ack's stream entry stays
pending until a worker settles it, so a bridge relays it again after FSM_RELAY_TIMEOUT_SECONDS
(tests/integration/test_settled_acks.py forces that loss): seconds, not the state's deadline."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from sqlalchemy import func, select

from fsm_celery.store.tables import transitions
from tests.support.messages import FIX_BUG_STATES
from tests.support.processes import FsmEnv
from tests.support.sentinel import SentinelCluster

MACHINES = 200
CONTEXT = {"projectName": "sla-api", "githubIssue": 7}
STEPS = len(FIX_BUG_STATES)  # history rows of a machine that took its one path


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[SentinelCluster]:
    found = SentinelCluster.start(tmp_path / "redis")
    yield found
    found.stop()


@pytest.fixture
def env(
    env_factory: Callable[..., FsmEnv], cluster: SentinelCluster, transition_mode: str
) -> Iterator[FsmEnv]:
    """A deployment on the cluster, its processes stopped before the cluster is (stopped after,
    each would wait for Redis until it is killed)."""
    found = env_factory(
        f"failover_{transition_mode}",
        redis_url=cluster.url,
        transition_mode=transition_mode,
        redis_replicas=1,
    )
    yield found
    found.stop_all()


def _rows(env: FsmEnv) -> int:
    with env.client.engine.db.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(transitions)).scalar_one())


@pytest.mark.parametrize("transition_mode", ["celery", "inline"])
def test_a_primary_killed_mid_load_loses_nothing_and_doubles_nothing(
    env: FsmEnv, cluster: SentinelCluster, transition_mode: str
) -> None:
    worker = env.start_worker(supervised=False)
    bridge = env.start_bridge()
    agent = env.start_agent(
        "--mock", "--agent-type", "cto", "--concurrency", "64", "--think", "0.5"
    )
    env.wait_for_agents(1)
    ids = [env.client.start_machine("cto_fix_bug", CONTEXT) for _ in range(MACHINES)]
    deadline = time.monotonic() + 60
    while _rows(env) < MACHINES * STEPS * 0.3:  # mid-load: a third of the transitions made
        assert time.monotonic() < deadline, "the machines do not move"
        time.sleep(0.05)

    killed_at = time.monotonic()
    before = _rows(env)
    old = cluster.kill_primary()
    new_port = cluster.wait_for_failover(old.port)
    promoted = time.monotonic() - killed_at
    while _rows(env) == before:  # the first transition after the kill
        assert time.monotonic() - killed_at < 60, "nothing moved after the failover"
        time.sleep(0.02)
    stall = time.monotonic() - killed_at
    cluster.bring_back(old)
    cluster.wait_for_rejoin(old.port)

    for mid in ids:
        assert env.wait_until_done(mid, timeout=120).status == "completed", mid
    for proc in (worker, bridge, agent):
        assert proc.popen.poll() is None, f"{proc.name} exited: see {proc.log}"
    paths = {mid: [r.to_state for r in env.client.history(mid)] for mid in ids}
    retried = sum(len(p) - STEPS for p in paths.values())
    assert retried == 0, {mid: p for mid, p in paths.items() if len(p) != STEPS}
    assert all(p[-1] == "COMPLETE" for p in paths.values())
    copies = env.client.rejected(limit=10_000)
    assert {r["reason"] for r in copies} <= {"stale_attempt"}, copies[:3]
    # the promoted replica, or the old node again if the load made the sentinels fail over twice
    assert cluster.primary_port() in {new_port, old.port}
    print(
        f"\n{transition_mode}: {MACHINES} machines completed, 0 lost, 0 applied twice; "
        f"primary killed after {before} of ~{MACHINES * STEPS} transitions; replica promoted "
        f"in {promoted:.1f} s, first transition after the kill at {stall:.1f} s; the failover "
        f"cost {retried} attempts more and {len(copies)} copies refused as stale"
    )
