"""Celery on RabbitMQ (FSM_BROKER_URL amqp://), the agents on Redis: a deployment of its own on a
throwaway RabbitMQ node and PostgreSQL server, in the celery mode. Its queues are quorum queues
with a dead-letter queue each; under a worker, bridge or agent SIGKILL, a RabbitMQ restart and
a PostgreSQL restart, nothing is lost, nothing is applied twice, and every machine reaches its
end (the other faults, on Redis: test_faults.py). Flower and doctor work on it."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from fsm_celery.channel.redis import connect
from fsm_celery.http.fleet import fleet
from fsm_celery.worker.broker import DEAD
from tests.integration.test_flower import AUTH, tasks_of
from tests.support.agents import ScriptedAgent
from tests.support.databases import create_template
from tests.support.faults import assert_each_finished_exactly_once, start_many, wait_for_progress
from tests.support.messages import Reply
from tests.support.processes import FsmEnv, make_env
from tests.support.rabbitmq import RabbitMQ, celery_app, on_rabbitmq
from tests.support.services import Postgres, Services

# Machines in flight when a fault comes: each fault finds states entered, acks on their way
# and tasks in RabbitMQ's queues (a worker holds 32 at most, the bridge reads 500 at once).
UNDER_LOAD = 100


@dataclass
class Deployment:
    env: FsmEnv
    rabbit: RabbitMQ
    postgres: Postgres


@pytest.fixture(scope="module")
def amqp(services: Services) -> Iterator[Deployment]:
    """Worker, beat and bridge on RabbitMQ and a PostgreSQL of the file's own (both restarted
    by a test); the agents' tasks and acks on the suite's Redis."""
    # not tmp_path: pytest's directories are 0700 and the server may run as `postgres`
    directory = Path(tempfile.mkdtemp(prefix="fsm-celery-amqp-"))
    rabbit = RabbitMQ.start(directory / "rabbitmq")
    postgres = Postgres(directory / "postgres").init().start()
    env: FsmEnv | None = None
    try:
        create_template(postgres.url, "template_fsm")
        env = make_env(
            "amqp",
            postgres.url,
            "template_fsm",
            services.redis_url,
            broker_url=rabbit.url,
            transition_mode="celery",
            stream_claim_idle_seconds=1.0,
        )
        on_rabbitmq(env)
        env.start_bridge(processes=2)
        env.start_worker(beat=True)
        yield Deployment(env, rabbit, postgres)
    finally:
        if env is not None:
            env.stop_all()
            env.client.engine.db.dispose()
        postgres.stop()
        rabbit.stop()
        shutil.rmtree(directory, ignore_errors=True)


def _finish(env: FsmEnv, ids: list[uuid.UUID]) -> None:
    infos = [env.wait_until_done(mid, timeout=180) for mid in ids]
    assert {info.status for info in infos} == {"completed"}
    assert_each_finished_exactly_once(env, ids)


def test_the_tasks_queues_are_quorum_queues_with_a_dead_letter_queue(amqp: Deployment) -> None:
    queue = amqp.env.settings.queue
    with ScriptedAgent(amqp.env) as agent:
        _finish(amqp.env, start_many(amqp.env, agent, 3))
    assert amqp.rabbit.queue_type(queue) == "quorum"
    assert amqp.rabbit.queue_type(amqp.env.settings.housekeeping_queue) == "quorum"
    assert amqp.rabbit.queue_type(queue + DEAD) == "quorum"
    assert amqp.rabbit.queue_length(queue + DEAD) == 0


def test_a_retry_delay_is_entered_by_the_scan(amqp: Deployment) -> None:
    """No countdown on RabbitMQ: the state whose attempt failed is entered again once due."""
    script = {"ONE": [Reply(success=False, error="not yet")]}
    with ScriptedAgent(amqp.env, script) as agent:
        [mid] = start_many(amqp.env, agent, 1)
        assert amqp.env.wait_until_done(mid, timeout=60).status == "completed"
    ones = [row for row in amqp.env.client.history(mid) if row.from_state == "ONE"]
    assert [row.success for row in ones] == [False, True]


def test_sigkill_of_the_worker_loses_and_doubles_nothing(amqp: Deployment) -> None:
    env = amqp.env
    with ScriptedAgent(env) as agent:
        ids = start_many(env, agent, UNDER_LOAD)
        wait_for_progress(agent, UNDER_LOAD + UNDER_LOAD // 3)
        for proc in env.procs:
            if proc.name == "worker":
                proc.kill()
        env.start_worker(beat=True)
        _finish(env, ids)


def test_sigkill_of_the_bridge_loses_and_doubles_no_ack(amqp: Deployment) -> None:
    env = amqp.env
    with ScriptedAgent(env, via_stream=True) as agent:
        ids = start_many(env, agent, UNDER_LOAD)
        wait_for_progress(agent, UNDER_LOAD + UNDER_LOAD // 3)
        for proc in env.procs:
            if proc.name == "bridge":
                proc.kill()  # mid-batch: read, perhaps relayed to RabbitMQ, not XACKed
        env.start_bridge(processes=2)
        _finish(env, ids)


def test_sigkill_of_the_agent_loses_and_doubles_nothing(amqp: Deployment) -> None:
    env = amqp.env
    agent_id = str(uuid.uuid4())
    think = {"LINEAR_AGENT_THINK": "0.3"}
    agent = env.start_agent("tests/integration/linear_agent.py", agent_id, extra_env=think)
    env.wait_for_agents(1)
    ids = [env.client.start_machine("test_linear", {}, agent_id=agent_id) for _ in range(40)]
    env.wait_for_state(ids[-1], "TWO", timeout=60)
    agent.kill()  # tasks in its hands, their acks not sent
    env.start_agent("tests/integration/linear_agent.py", agent_id, extra_env=think)
    _finish(env, ids)


def test_a_rabbitmq_restart_loses_and_doubles_nothing(amqp: Deployment) -> None:
    """The quorum queues are durable: what they held is there after the restart; the worker
    and the bridge reconnect (a publish in between fails, and is tried again)."""
    env = amqp.env
    env.ensure_worker(beat=True)
    with ScriptedAgent(env, via_stream=True) as agent:
        ids = start_many(env, agent, UNDER_LOAD)
        wait_for_progress(agent, UNDER_LOAD + UNDER_LOAD // 3)
        amqp.rabbit.restart(down=1.0)
        _finish(env, ids)


def test_a_postgres_restart_loses_and_doubles_nothing(amqp: Deployment) -> None:
    env = amqp.env
    env.ensure_worker(beat=True)
    with ScriptedAgent(env) as agent:
        ids = start_many(env, agent, UNDER_LOAD)
        wait_for_progress(agent, UNDER_LOAD + UNDER_LOAD // 3)
        amqp.postgres.restart()
        _finish(env, ids)


def test_flower_lists_the_tasks_run_through_rabbitmq(amqp: Deployment) -> None:
    env = amqp.env
    _, port = env.start_flower(basic_auth=AUTH)
    with ScriptedAgent(env) as agent:
        # Flower serves before its queue on the events exchange is bound: it sees the events
        # from then on, which a first machine's tasks tell (the worker runs already here)
        deadline = time.monotonic() + 60
        while True:
            [warm] = start_many(env, agent, 1)
            _finish(env, [warm])
            if tasks_of(port, str(warm), "fsm.enter_state", 1):
                break
            assert time.monotonic() < deadline, "Flower saw no task event"
        [mid] = start_many(env, agent, 1)
        _finish(env, [mid])
    entered = tasks_of(port, str(mid), "fsm.enter_state", 3)
    assert len(entered) == 3, entered
    assert all(task["args"].startswith(f"test_linear {mid} state=") for task in entered)


def test_doctor_names_rabbitmq_and_counts_its_queues(amqp: Deployment) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fsm_celery", "doctor"],
        env=amqp.env.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    [line] = [row for row in done.stdout.splitlines() if row[2:].startswith("broker:")]
    port = amqp.rabbit.port
    assert line.startswith(f"✔ broker: RabbitMQ at amqp://guest:***@127.0.0.1:{port}//"), line
    assert f"{amqp.env.settings.queue} 0" in line, line


def test_the_dashboards_queue_lengths_are_read_from_rabbitmq(amqp: Deployment) -> None:
    """fsm_celery_queue_length counts RabbitMQ's ready messages (a queue not declared: 0)."""
    settings = amqp.env.settings.model_copy(update={"queue": f"{amqp.env.settings.queue}-idle"})
    app = celery_app(settings)  # a queue no worker consumes, so that what is sent stays there
    with app.producer_or_acquire() as producer:
        for _ in range(3):
            app.send_task("fsm.enter_state", (str(uuid.uuid4()), 0), producer=producer)
    collector = fleet(settings, amqp.env.client.engine.db, connect)
    lengths = {
        sample.labels["queue"]: sample.value
        for family in collector.collect()
        for sample in family.samples
        if sample.name == "fsm_celery_queue_length"
    }
    assert lengths == {settings.queue: 3, settings.housekeeping_queue: 0}
