"""Security finding 21: deployments split by Redis database number. Redis ACLs cannot keep a
user in one database, so an agent of a deployment in database 0 is denied SELECT, and one in
another database gets credentials only under a channel prefix of its own, which leaves it
nothing to reach elsewhere. Doctor says when a deployment without a prefix shares its Redis."""

from __future__ import annotations

import subprocess
import sys
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from fsm_celery.channel.acl import agent_username, create_agent_user, new_password
from fsm_celery.core.messages import agent_ack_stream, task_stream
from tests.support.processes import FsmEnv
from tests.support.services import start_redis, stop_redis

HOST = "127.0.0.1"


@pytest.fixture(scope="module")
def port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    process, port = start_redis(tmp_path_factory.mktemp("redis-databases"))
    try:
        yield port
    finally:
        stop_redis(process)


def _agent(port: int, database: int, prefix: str) -> tuple[str, str, redis.Redis]:
    """A new agent user of the deployment in `database`: its id, password, and a connection
    as it there."""
    agent, password = str(uuid.uuid4()), new_password()
    with redis.Redis(host=HOST, port=port, db=database) as admin:
        create_agent_user(admin, agent, "cto", prefix, password)
    user = agent_username(agent)
    client = redis.Redis(host=HOST, port=port, db=database, username=user, password=password)
    return agent, password, client


def test_an_agent_of_database_0_cannot_select_another(port: int) -> None:
    agent, password, client = _agent(port, 0, "")
    with redis.Redis(host=HOST, port=port, db=1) as other:  # a deployment in database 1
        other.xgroup_create(task_stream("cto"), "agents", id="0", mkstream=True)
    client.xadd(agent_ack_stream(agent), {"message": "{}"})  # its own, in its own database
    with pytest.raises(redis.exceptions.NoPermissionError):
        client.execute_command("SELECT", "1")
    with pytest.raises(redis.exceptions.NoPermissionError):  # nor by its URL
        redis.Redis.from_url(f"redis://{agent_username(agent)}:{password}@{HOST}:{port}/1").ping()
    client.close()


def test_an_agent_of_another_database_reaches_nothing_of_database_0(port: int) -> None:
    agent, _, client = _agent(port, 2, "d2:")
    with redis.Redis(host=HOST, port=port, db=0) as db0:  # a deployment in 0, prefix "d0:"
        db0.xgroup_create(task_stream("cto", "d0:"), "agents", id="0", mkstream=True)
        db0.xadd(task_stream("cto", "d0:"), {"message": "a task of d0"})
        client.execute_command("SELECT", "0")  # Redis cannot refuse it this one
        for attempt in (
            lambda: client.xreadgroup("agents", "me", {task_stream("cto", "d0:"): ">"}),
            lambda: client.xadd(agent_ack_stream(agent, "d0:"), {"message": "{}"}),
            lambda: client.xadd(agent_ack_stream(agent), {"message": "{}"}),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                attempt()
        # What it may write lands under its own prefix, which no bridge of d0 reads.
        client.xadd(agent_ack_stream(agent, "d2:"), {"message": "{}"})
        assert db0.keys("d0:stream:state:ack*") == []
    client.close()


def _doctor_line(env: FsmEnv, **overrides: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "fsm_celery", "doctor"],
        env={**env.env, **overrides},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    return next(line for line in done.stdout.splitlines() if line[2:].startswith("channel prefix"))


@pytest.fixture(scope="module")
def deployment(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    return env_factory("databases")


def test_doctor_warns_of_no_prefix_on_a_shared_redis(deployment: FsmEnv, port: int) -> None:
    url = f"redis://{HOST}:{port}"
    admin = redis.Redis(host=HOST, port=port)
    admin.flushall()  # (doctor's worker check leaves Celery's keys in its own database)
    line = _doctor_line(deployment, FSM_REDIS_URL=f"{url}/0", FSM_CHANNEL_PREFIX="")
    assert line == "✔ channel prefix: none (the only deployment on this Redis)"
    admin.flushall()
    line = _doctor_line(deployment, FSM_REDIS_URL=f"{url}/4", FSM_CHANNEL_PREFIX="")
    assert line.startswith("✘ channel prefix: none, on a shared Redis (database 4):"), line
    assert "give each deployment its own FSM_CHANNEL_PREFIX" in line
    admin.flushall()
    redis.Redis(host=HOST, port=port, db=5).set("another deployment", "1")
    line = _doctor_line(deployment, FSM_REDIS_URL=f"{url}/0", FSM_CHANNEL_PREFIX="")
    assert "(database 0; databases [5] hold keys)" in line, line
    line = _doctor_line(deployment, FSM_REDIS_URL=f"{url}/0", FSM_CHANNEL_PREFIX="d0:")
    assert line == "✔ channel prefix: 'd0:'"
    admin.close()
