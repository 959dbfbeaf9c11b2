"""A Celery worker rides out Redis restarts on its own, with tasks in flight.

The worker here is one `celery worker` process, not supervised: if it exits, the test fails.
It runs as production does (prefork, two processes, embedded beat, late acks, events) against
a redis-server of the test's own, which the test shuts down (SHUTDOWN NOSAVE) and starts again
while tasks keep arriving. Without fsm_celery.worker.kombu_patch the worker died in every run
(10 of 10, at restart 1 to 5): "Unrecoverable error: AttributeError(\"'NoneType' object has no
attribute 'hostname'\")".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import redis
from celery import Celery
from kombu.exceptions import OperationalError
from redis.backoff import NoBackoff
from redis.retry import Retry

from fsm_celery.core.loader import SHIPPED_DEFINITIONS
from tests.support import ROOT
from tests.support.credentials import TEST_SECRET
from tests.support.databases import create_template, drop_database
from tests.support.services import HOST, Services, free_port, start_redis

RESTARTS = 7
DOWNTIME = 0.5  # seconds Redis stays down
TASK_RATE = 100  # tasks sent per second at most, so that every restart finds some in flight
IN_FLIGHT = 20  # tasks sent before each restart, whatever time that takes
PROBE_TIMEOUT = 20.0  # the worker retries its connection every 2 s, then runs the probe


@dataclass
class Broker:
    """A redis-server the test owns: it can stop and start it on the same port."""

    directory: Path
    port: int
    process: subprocess.Popen[bytes]

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def shut_down(self) -> None:
        # No retries: the connection SHUTDOWN closes is the answer, not a reason to reconnect.
        with redis.Redis(host=HOST, port=self.port, retry=Retry(NoBackoff(), 0)) as client:
            client.shutdown(nosave=True)
        self.process.wait(10)

    def start(self) -> None:
        self.process, _ = start_redis(self.directory, port=self.port)

    def restart(self) -> None:
        self.shut_down()
        time.sleep(DOWNTIME)
        self.start()


@dataclass
class Worker:
    """One `celery worker` process of the project's app, and its log."""

    process: subprocess.Popen[bytes]
    log: Path

    def tail(self) -> str:
        return self.log.read_text(errors="replace")[-6000:]

    def assert_alive(self, when: str) -> None:
        code = self.process.poll()
        assert code is None, f"the worker exited with {code} {when}; log:\n{self.tail()}"

    def wait_for_log(self, needle: str, when: str, timeout: float = PROBE_TIMEOUT) -> None:
        deadline = time.monotonic() + timeout
        while needle not in self.log.read_text(errors="replace"):
            self.assert_alive(when)
            if time.monotonic() > deadline:
                raise AssertionError(f"the worker did not log {needle!r} {when}:\n{self.tail()}")
            time.sleep(0.1)


@pytest.fixture
def broker(tmp_path: Path) -> Iterator[Broker]:
    if shutil.which("redis-server") is None:
        pytest.fail("redis-server is not on PATH: this test restarts a Redis of its own")
    directory = tmp_path / "redis"
    directory.mkdir()
    process, port = start_redis(directory, port=free_port())
    server = Broker(directory, port, process)
    yield server
    if server.process.poll() is None:
        server.process.terminate()
        server.process.wait(10)


@pytest.fixture
def database_url(services: Services) -> Iterator[str]:
    name = f"fsm_test_redis_restart_{os.getpid()}"
    create_template(services.pg_url, name)  # created and migrated
    yield f"{services.pg_url}/{name}"
    drop_database(services.pg_url, name)


@pytest.fixture
def queue() -> str:
    return f"fsm-restart-{uuid.uuid4().hex[:8]}"


@pytest.fixture
def worker(broker: Broker, database_url: str, queue: str, tmp_path: Path) -> Iterator[Worker]:
    env = {
        **os.environ,
        "FSM_REDIS_URL": broker.url,
        "FSM_BROKER_URL": broker.url,
        "FSM_DATABASE_URL": database_url,
        "FSM_TASK_TOKEN_SECRET": TEST_SECRET,
        "FSM_QUEUE": queue,
        "FSM_DEFINITIONS_PATH": str(SHIPPED_DEFINITIONS),
    }
    argv = [
        *(sys.executable, "-m", "celery", "-A", "fsm_celery", "worker", "-Q", queue),
        *("-c", "2", "-P", "prefork", "-l", "info", "--without-mingle", "--without-gossip"),
        *("-n", f"{queue}@%h", "-B", "-s", str(tmp_path / "beat-schedule")),
    ]
    log = tmp_path / "worker.log"
    with log.open("wb") as handle:  # its own session: the pool and beat go down with it
        process = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=handle, stderr=subprocess.STDOUT, start_new_session=True
        )
    started = Worker(process, log)
    try:
        started.wait_for_log(" ready.", "at start")
        yield started
    finally:
        stop_worker(process)


def stop_worker(process: subprocess.Popen[bytes]) -> None:
    """A warm shutdown (SIGTERM), then SIGKILL to its whole session, whatever is left of it."""
    if process.poll() is None:
        process.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(10)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.wait()


@pytest.fixture
def producer(broker: Broker, queue: str) -> Iterator[Celery]:
    """A client of the worker's queue, routed as celeryconfig routes (by queue name alone)."""
    app = Celery("redis-restart-producer", set_as_current=False)
    app.conf.update(
        broker_url=broker.url,
        task_default_queue=queue,
        task_default_exchange="",
        task_default_routing_key=queue,
        task_serializer="json",
    )
    yield app
    app.close()


class Flow:
    """Sends scan tasks at TASK_RATE from a thread, through every outage, until stopped."""

    def __init__(self, producer: Celery) -> None:
        self.producer = producer
        self.sent = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Flow:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(10)

    def _run(self) -> None:
        while not self._stop.wait(1 / TASK_RATE):
            try:
                self.producer.send_task("fsm.scan", retry=False)
                self.sent += 1
            except OperationalError:  # Redis is down: the next one will do
                self._stop.wait(0.1)


def run_probe(producer: Celery, worker: Worker, when: str) -> None:
    """Send one task of a known id and wait until the worker ran it."""
    task_id = str(uuid.uuid4())
    deadline = time.monotonic() + PROBE_TIMEOUT
    while True:
        try:
            producer.send_task("fsm.scan", task_id=task_id, retry=False)
            break
        except OperationalError:  # Redis is still starting
            worker.assert_alive(when)
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
    worker.wait_for_log(f"Task fsm.scan[{task_id}] succeeded", when)


def test_worker_survives_redis_restarts_with_tasks_in_flight(
    broker: Broker, worker: Worker, producer: Celery
) -> None:
    run_probe(producer, worker, "before any restart")
    between = []  # tasks sent before each restart, since the one before it
    with Flow(producer) as flow:
        for restart in range(1, RESTARTS + 1):
            between.append(wait_for_flow(flow, worker, f"before restart {restart}"))
            broker.restart()
            run_probe(producer, worker, f"after restart {restart} of {RESTARTS}")
    # Also lets the tasks in flight finish: a warm shutdown racing a task that completes as it
    # begins can wait 30 s on the pool, with or without restarts (billiard, not this test's).
    run_probe(producer, worker, "once tasks stopped flowing")
    # That tasks flowed between the restarts, never how fast (a loaded machine sends fewer)
    assert all(n >= IN_FLIGHT for n in between), between


def wait_for_flow(flow: Flow, worker: Worker, when: str) -> int:
    """Wait a second, then until IN_FLIGHT tasks at least were sent since the last call (so
    some are in flight when Redis goes away); how many were."""
    since = flow.sent
    time.sleep(1.0)
    deadline = time.monotonic() + PROBE_TIMEOUT
    while flow.sent - since < IN_FLIGHT:
        worker.assert_alive(when)
        assert time.monotonic() < deadline, f"no task was sent {when}: {flow.sent - since}"
        time.sleep(0.05)
    return flow.sent - since
