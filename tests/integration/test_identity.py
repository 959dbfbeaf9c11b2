"""Acceptance: only the assigned agent moves a machine. The sender of a message is the agent
whose ack stream it arrived on; under real Redis ACL users (issued by the real CLI) an agent can
write nowhere else, and the deployment can refuse the shared, anonymous channel and stream."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from fsm_celery.agent.sdk import Agent, Task
from fsm_celery.channel.acl import agent_username
from fsm_celery.core.messages import ack_stream, agent_ack_stream
from fsm_celery.store.agents import live_agents_txn
from tests.integration.conftest import ONE_MODE
from tests.support import ROOT
from tests.support.agents import ScriptedAgent, serving
from tests.support.messages import SILENT, ack_for
from tests.support.processes import FsmEnv
from tests.support.services import RedisServer, start_redis, stop_redis


def _status(agent_id: str, agent_type: str = "tester") -> dict[str, Any]:
    return {
        "type": "agent_status",
        "agentId": agent_id,
        "agentType": agent_type,
        "status": "active",
        "concurrency": 1,
    }


def _xadd_as(env: FsmEnv, sender: str, message: dict[str, Any]) -> None:
    stream = agent_ack_stream(sender, env.settings.channel_prefix)
    env.redis.xadd(stream, {"message": json.dumps(message)})


@ONE_MODE
def test_an_ack_from_another_agents_stream_is_refused_as_wrong_agent(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm, {"FIRST": [SILENT]}, own_stream=True) as owner:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=owner.id)
        task = owner.wait_for_tasks(1)
        thief = str(uuid.uuid4())
        _xadd_as(fsm, thief, ack_for(task))  # a valid token, from the wrong agent
        [refused] = fsm.wait_for_rejections(mid, 1)
        assert refused["reason"] == "wrong_agent"
        assert f"assigned to agent {owner.id}, not {thief}" in refused["detail"]
        assert fsm.client.get_machine(mid).current_state == "FIRST"
        owner.send(ack_for(task))
        assert fsm.wait_until_done(mid).status == "completed"


@ONE_MODE
def test_a_status_sent_for_another_agent_is_refused(fsm: FsmEnv) -> None:
    victim, sender = str(uuid.uuid4()), str(uuid.uuid4())
    before = len(fsm.client.rejected(None, limit=10_000))
    _xadd_as(fsm, sender, _status(victim))
    found = fsm.wait_for_rejections(None, before + 1)
    assert found[-1]["reason"] == "wrong_agent"
    assert found[-1]["detail"] == f"agent {sender} reported a status for agent {victim}"
    assert victim not in {a["id"] for a in fsm.client.agents()}


@ONE_MODE
def test_a_status_claiming_another_type_than_registered_is_refused(fsm: FsmEnv) -> None:
    agent = str(uuid.uuid4())
    fsm.client.register_agent(agent, "tester")
    before = len(fsm.client.rejected(None, limit=10_000))
    _xadd_as(fsm, agent, _status(agent, "cto"))
    found = fsm.wait_for_rejections(None, before + 1)
    assert found[-1]["reason"] == "wrong_agent"
    assert "registered as type 'tester', not 'cto'" in found[-1]["detail"]
    _xadd_as(fsm, agent, _status(agent, "tester"))
    fsm.wait_for_agents(1)
    assert any(a["id"] == agent and a["status"] == "active" for a in fsm.client.agents())


# ---- a deployment that accepts only per-agent streams, on a Redis with ACL users ----------


@pytest.fixture(scope="module")
def locked(
    env_factory: Callable[..., FsmEnv], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[FsmEnv]:
    process, port = start_redis(tmp_path_factory.mktemp("redis-locked"))
    try:
        env = env_factory(
            "locked", redis_url=f"redis://127.0.0.1:{port}/0", accept_shared_acks=False
        )
        env.start_worker()
        env.start_bridge()
        yield env
        env.stop_all()
    finally:
        stop_redis(process)


def _credentials(env: FsmEnv, agent_id: str, agent_type: str) -> str:
    """The agent's Redis URL, as `fsm-celery agents credentials --apply` prints it."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "fsm_celery",
            "agents",
            "credentials",
            agent_id,
            "--type",
            agent_type,
            "--apply",
        ],
        cwd=ROOT,
        env=env.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    url = re.search(r"^redis://\S+", done.stdout, re.MULTILINE)
    assert url is not None, done.stdout
    return url.group(0)


def test_an_agent_with_its_own_credentials_runs_machines_to_the_end(locked: FsmEnv) -> None:
    agent_id = str(uuid.uuid4())
    url = _credentials(locked, agent_id, "tester")
    agent = Agent("tester", redis_url=url, agent_id=agent_id, prefix=locked.settings.channel_prefix)

    @agent.handler("test_pair")
    def answer(task: Task) -> dict[str, Any]:
        return {"first": 1, "second": 2}

    with serving(agent):
        ids = [locked.client.start_machine("test_pair", {}, agent_id=agent_id) for _ in range(3)]
        for mid in ids:
            assert locked.wait_until_done(mid).status == "completed"


def test_an_agent_cannot_write_another_agents_acks_under_its_credentials(locked: FsmEnv) -> None:
    mine, other = str(uuid.uuid4()), str(uuid.uuid4())
    client = redis.Redis.from_url(_credentials(locked, mine, "tester"))
    prefix = locked.settings.channel_prefix
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.xadd(agent_ack_stream(other, prefix), {"message": json.dumps(_status(other))})
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.xadd(ack_stream(prefix), {"message": json.dumps(_status(other))})
    client.xadd(agent_ack_stream(mine, prefix), {"message": json.dumps(_status(mine))})
    client.close()


def test_a_revoked_agent_is_refused_and_its_user_not_created_again(locked: FsmEnv) -> None:
    agent_id = str(uuid.uuid4())
    url = _credentials(locked, agent_id, "tester")
    held = redis.Redis.from_url(url, retry_on_timeout=False)
    held.ping()  # a connection the agent opened before

    done = _cli(locked, "agents", "revoke", agent_id, "--reason", "laptop lost", "--actor", "ana")

    assert done.returncode == 0, done.stderr
    assert f"revoked {agent_id}: Redis user deleted" in done.stdout
    with pytest.raises(redis.ConnectionError):  # closed, and refused when it connects again
        held.ping()
    with pytest.raises(redis.AuthenticationError):
        redis.Redis.from_url(url).ping()
    users = redis.Redis.from_url(locked.settings.redis_url, decode_responses=True)
    watch_until = time.monotonic() + 3 * 2.0  # three of the bridge's checks for lost users
    while time.monotonic() < watch_until:
        assert agent_username(agent_id) not in users.acl_users(), "the bridge created it again"
        time.sleep(0.2)
    events = locked.client.credential_events(agent_id)
    assert [(e["action"], e["actor"], e["reason"]) for e in events] == [
        ("issued", "cli", ""),
        ("revoked", "ana", "laptop lost"),
    ]
    [row] = [a for a in locked.client.agents() if a["id"] == agent_id]
    assert row["status"] == "revoked" and row["acl_rules"] is None


def test_a_revoked_agents_reports_do_not_count_until_it_gets_new_credentials(
    locked: FsmEnv,
) -> None:
    agent_id = str(uuid.uuid4())
    _credentials(locked, agent_id, "tester")
    assert _cli(locked, "agents", "revoke", agent_id).returncode == 0
    before = len(locked.client.rejected(None, limit=10_000))
    _xadd_as(locked, agent_id, _status(agent_id))  # written before the revocation, read after
    found = locked.wait_for_rejections(None, before + 1)
    assert (found[-1]["reason"], found[-1]["detail"]) == (
        "wrong_agent",
        f"agent {agent_id}'s credentials were revoked",
    )
    assert _agent(locked, agent_id)["status"] == "revoked"
    assert uuid.UUID(agent_id) not in _live(locked, "tester")  # no machine is assigned to it

    url = _credentials(locked, agent_id, "tester")  # issued again
    redis.Redis.from_url(url).xadd(
        agent_ack_stream(agent_id, locked.settings.channel_prefix),
        {"message": json.dumps(_status(agent_id))},
    )
    deadline = time.monotonic() + 20
    while _agent(locked, agent_id)["status"] != "active":
        assert time.monotonic() < deadline, "its report did not count after new credentials"
        time.sleep(0.1)
    assert uuid.UUID(agent_id) in _live(locked, "tester")


def _live(env: FsmEnv, agent_type: str) -> list[uuid.UUID]:
    """The agents of the type machines may be assigned to now."""
    since = datetime.now(UTC) - timedelta(seconds=env.settings.agent_liveness_seconds)
    with env.client.engine.db.connect() as conn:
        return live_agents_txn(conn, agent_type, since)


def _agent(env: FsmEnv, agent_id: str) -> dict[str, Any]:
    [row] = [a for a in env.client.agents() if a["id"] == agent_id]
    return row


def test_revoking_an_agent_never_known_changes_nothing(locked: FsmEnv) -> None:
    stranger = str(uuid.uuid4())
    done = _cli(locked, "agents", "revoke", stranger)
    assert done.returncode != 0
    assert f"no agent {stranger}" in done.stderr
    assert locked.client.credential_events(stranger) == []
    assert stranger not in {a["id"] for a in locked.client.agents()}


def _cli(env: FsmEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsm_celery", *args],
        cwd=ROOT,
        env=env.env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_the_shared_stream_is_not_read_when_shared_acks_are_refused(locked: FsmEnv) -> None:
    with ScriptedAgent(locked, {"FIRST": [SILENT]}, own_stream=True) as agent:
        mid = locked.client.start_machine("test_pair", {}, agent_id=agent.id)
        task = agent.wait_for_tasks(1)
        prefix = locked.settings.channel_prefix
        locked.redis.xadd(ack_stream(prefix), {"message": json.dumps(ack_for(task))})
        locked.redis.publish(f"{prefix}channel:state:ack", json.dumps(ack_for(task)))
        agent.send(ack_for(task))  # its own stream: the one that counts
        assert locked.wait_until_done(mid).status == "completed"
        assert locked.redis.xlen(ack_stream(prefix)) == 1  # never read, never acknowledged
        history = locked.client.history(mid)
        assert [row.attempt for row in history] == list(range(len(history)))


def test_agents_users_come_back_after_redis_restarts_without_them(
    env_factory: Callable[..., FsmEnv], tmp_path: Path
) -> None:
    """Redis restarted without an aclfile (or a replica promoted: ACL users are not
    replicated) has lost the agents' users: the bridge creates them again from what
    `agents credentials --apply` kept (their rules, the password hashed), and the agent,
    refused meanwhile, goes on with the same credentials."""
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis")
    env = env_factory("acl_restart", redis_url=server.url, accept_shared_acks=False)
    try:
        env.start_worker()
        env.start_bridge()
        agent_id = str(uuid.uuid4())
        url = _credentials(env, agent_id, "tester")
        agent = Agent(
            "tester", redis_url=url, agent_id=agent_id, prefix=env.settings.channel_prefix
        )

        @agent.handler("test_pair")
        def answer(task: Task) -> dict[str, Any]:
            return {"first": 1, "second": 2}

        with serving(agent):
            first = env.client.start_machine("test_pair", {}, agent_id=agent_id)
            assert env.wait_until_done(first).status == "completed"
            server.restart()  # SHUTDOWN NOSAVE: the users go with everything else
            admin = redis.Redis(host="127.0.0.1", port=server.port, decode_responses=True)
            deadline = time.monotonic() + 20
            while agent_username(agent_id) not in admin.acl_users():
                assert time.monotonic() < deadline, "the bridge did not create the user again"
                time.sleep(0.1)
            second = env.client.start_machine("test_pair", {}, agent_id=agent_id)
            assert env.wait_until_done(second, timeout=60).status == "completed"
        with pytest.raises(redis.AuthenticationError):  # the same rules: the password still holds
            redis.Redis.from_url(url.replace(url.split(":")[2].split("@")[0], "wrong")).ping()
        redis.Redis.from_url(url).ping()
    finally:
        env.stop_all()
        server.stop()
