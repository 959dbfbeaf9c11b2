"""An answer the SDK agent could not send is sent again once Redis takes it, without waiting
for a reconnect: its task stays pending, and the agent reads its pending tasks again.

Redis refuses the agent's answer (its user loses XADD, XACK and XDEL on a real server) for
longer than the agent's tries last, while its reads go on: the reading thread never sees an
error, as when its client's own retries ride a failover out. Without the read again, the task
would wait for its state's deadline (a failover's flake: a machine left at its state)."""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import redis

from fsm_celery.agent.sdk import GROUP, Agent
from fsm_celery.channel.acl import agent_username, create_agent_user, new_password
from fsm_celery.core.messages import agent_ack_stream, task_stream
from tests.support.messages import state_task_wire
from tests.support.services import start_redis, stop_redis

HOST = "127.0.0.1"
AGENT_TYPE = "cto"


@pytest.fixture
def admin(tmp_path: Any) -> Iterator[redis.Redis]:
    process, port = start_redis(tmp_path)
    client = redis.Redis(host=HOST, port=port)
    try:
        yield client
    finally:
        client.close()
        stop_redis(process)


class GaveUp(logging.Handler):
    """Notes the agent's giving up on an answer (its log's warning)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().startswith("could not answer"):
            self.seen.set()


def test_an_answer_given_up_on_is_sent_once_redis_takes_it(admin: redis.Redis) -> None:
    agent_id, password = str(uuid.uuid4()), new_password()
    create_agent_user(admin, agent_id, AGENT_TYPE, "", password)
    port = admin.connection_pool.connection_kwargs["port"]
    agent = Agent(
        AGENT_TYPE,
        redis_url=f"redis://{agent_username(agent_id)}:{password}@{HOST}:{port}/0",
        agent_id=agent_id,
        replicas=0,
    )
    finish = threading.Event()

    @agent.handler("test_linear", "ONE")
    def work(task: Any) -> dict[str, Any]:
        finish.wait(30)
        return {"done": True}

    gave_up = GaveUp()
    logging.getLogger("fsm_celery.agent.sdk").addHandler(gave_up)
    serving = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    try:
        serving.start()
        tasks = task_stream(agent_id, "")
        _wait(lambda: admin.exists(tasks) and admin.xinfo_groups(tasks), "the agent's group")
        machine_id = str(uuid.uuid4())
        admin.xadd(tasks, {"message": _state_task(machine_id)})
        _wait(lambda: admin.xpending(tasks, GROUP)["pending"] == 1, "the task read")
        # Redis refuses the answer from now on (the reads go on)
        admin.execute_command("ACL", "SETUSER", agent_username(agent_id), "-xack", "-xdel")
        admin.execute_command("ACL", "SETUSER", agent_username(agent_id), "clearselectors")
        finish.set()
        assert gave_up.seen.wait(60), "the agent did not give its answer up"
        assert _answers(admin, agent_id) == []
        create_agent_user(admin, agent_id, AGENT_TYPE, "", password)  # Redis takes it again

        _wait(lambda: _answers(admin, agent_id), "the answer sent again")
        (ack,) = _answers(admin, agent_id)
        assert (ack["machineId"], ack["success"], ack["output"]) == (
            machine_id,
            True,
            {"done": True},
        )
        _wait(lambda: admin.xpending(tasks, GROUP)["pending"] == 0, "the task acknowledged")
        assert admin.xlen(tasks) == 0
    finally:
        agent.stop()
        serving.join(15)
        logging.getLogger("fsm_celery.agent.sdk").removeHandler(gave_up)


def _answers(admin: redis.Redis, agent_id: str) -> list[dict[str, Any]]:
    """The state_acks in the agent's ack stream (its status reports go there too)."""
    entries: Any = admin.xrange(agent_ack_stream(agent_id, ""))
    messages = [json.loads(fields[b"message"]) for _, fields in entries]
    return [m for m in messages if m["type"] == "state_ack"]


def _state_task(machine_id: str) -> str:
    deadline = datetime.now(UTC) + timedelta(minutes=10)
    return state_task_wire(deadline, machine_id, timeout_ms=600_000)


def _wait(condition: Any, what: str, seconds: float = 60) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {seconds} s"
        time.sleep(0.05)
