"""Real services for integration tests: databases, worker and bridge processes, scripted agents.

Nothing here is a mock: each environment has its own PostgreSQL database (a copy of a migrated
template), its own Celery queue and channel prefix on the test Redis, real `celery worker` and
`fsm-celery ack-bridge` processes, and agents that speak the wire protocol with plain redis-py.
"""

from __future__ import annotations

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from fsm_celery import wiring
from fsm_celery.agent.mock import OUTPUTS as MOCK_OUTPUTS
from fsm_celery.agent.sdk import Agent
from fsm_celery.client import Client, MachineInfo
from fsm_celery.config import Settings
from fsm_celery.core.loader import SHIPPED_DEFINITIONS
from fsm_celery.core.messages import (
    ack_channel,
    ack_stream,
    agent_ack_stream,
    task_channel,
    task_stream,
)
from fsm_celery.store.db import connect, upgrade
from tests.secret import TEST_SECRET

ROOT = Path(__file__).resolve().parents[2]
FIXTURE_DEFINITIONS = ROOT / "tests" / "fixtures" / "definitions"
LOGS = Path(os.environ.get("FSM_TEST_LOGS", "/tmp/fsm-celery-test-logs"))
# The HTTP API's credentials in every test deployment (32+ bytes of no one repeated character,
# as the settings demand).
ADMIN_TOKEN = "test-admin-token-" + "0a1b2c3d4e5f6789" * 2
VIEWER_TOKEN = "test-viewer-token-" + "9f8e7d6c5b4a3210" * 2
WEBHOOK_SECRET = "test-github-webhook-secret"
API_BASE = "https://testserver"  # what env.api() asks: the dashboard behind TLS
TERMINAL = {"completed", "failed", "cancelled"}


def require_services(pg_url: str, redis_url: str) -> None:
    """Fail loudly, naming the service, when PostgreSQL or Redis is not reachable."""
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        raise RuntimeError(f"Redis is required at {redis_url} and is not reachable: {exc}") from exc
    engine = create_engine(f"{pg_url}/postgres")
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as exc:
        raise RuntimeError(
            f"PostgreSQL is required at {pg_url} and is not reachable: {exc}"
        ) from exc
    finally:
        engine.dispose()


def admin_sql(pg_url: str, statement: str) -> None:
    engine = create_engine(f"{pg_url}/postgres", isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(statement))
    engine.dispose()


def create_template(pg_url: str, name: str) -> None:
    """A migrated database to copy for each environment."""
    drop_database(pg_url, name)
    admin_sql(pg_url, f'CREATE DATABASE "{name}"')
    db = connect(f"{pg_url}/{name}")
    upgrade(db)
    db.dispose()


def copy_database(pg_url: str, template: str, name: str) -> str:
    drop_database(pg_url, name)
    admin_sql(pg_url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    return f"{pg_url}/{name}"


def drop_database(pg_url: str, name: str) -> None:
    admin_sql(pg_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@dataclass
class Proc:
    """A child process in its own session (so SIGKILL reaches its whole process group)."""

    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, sig)
            self.popen.wait(timeout=30)

    def stop(self) -> None:
        if self.popen.poll() is None:
            os.killpg(self.popen.pid, signal.SIGTERM)
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def wait_for_log(self, needle: str, timeout: float = 30.0) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if needle in self.log.read_text(errors="replace"):
                return
            if self.popen.poll() is not None:
                break
            time.sleep(0.1)
        raise RuntimeError(
            f"{self.name} did not log {needle!r}; log:\n"
            + self.log.read_text(errors="replace")[-4000:]
        )


@dataclass
class FsmEnv:
    """One isolated deployment: database, queue, channel prefix, and its processes."""

    name: str
    settings: Settings
    redis: redis.Redis
    client: Client
    procs: list[Proc] = field(default_factory=list)

    @property
    def env(self) -> dict[str, str]:
        """The environment of this deployment's processes: every setting as FSM_*."""
        fields = self.settings.model_dump(exclude_none=True)
        return {**os.environ, **{f"FSM_{k.upper()}": str(v) for k, v in fields.items()}}

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        LOGS.mkdir(parents=True, exist_ok=True)
        log = LOGS / f"{self.name}-{name}-{len(self.procs)}.log"
        handle = log.open("wb")
        popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=self.env if env is None else env,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        handle.close()
        proc = Proc(name, popen, log)
        self.procs.append(proc)
        return proc

    def start_worker(
        self,
        *,
        beat: bool = True,
        concurrency: int = 4,
        supervised: bool = True,
        pool: str = "threads",
    ) -> Proc:
        """A real `celery worker` on this environment's queue (with beat, which sends the scan).

        Supervised, it is started again whenever it exits, as a process manager (systemd,
        `restart: unless-stopped`) does in production: Celery's worker exits on some broker
        failures (a Redis restart while it restores unacknowledged messages) instead of
        reconnecting.
        """
        argv = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "fsm_celery",
            "worker",
            "-Q",
            self.settings.queue,
            "-c",
            str(concurrency),
            "-P",
            pool,
            "-l",
            "info",
            "--without-mingle",
            "--without-gossip",
            "-n",
            f"{self.name}-{uuid.uuid4().hex[:6]}@%h",
        ]
        if beat:
            argv += ["-B", "-s", str(LOGS / f"{self.name}-beat-{uuid.uuid4().hex[:6]}")]
        if supervised:
            argv = ["bash", "-c", f"while true; do {shlex.join(argv)}; sleep 0.5; done"]
        proc = self._spawn("worker", argv)
        proc.wait_for_log(" ready.")
        return proc

    def start_beat(self) -> Proc:
        """A real `celery beat` of its own, as production runs it (it sends the scan)."""
        schedule = LOGS / f"{self.name}-beat-{uuid.uuid4().hex[:6]}"
        argv = [sys.executable, "-m", "celery", "-A", "fsm_celery", "beat", "-s", str(schedule)]
        proc = self._spawn("beat", [*argv, "-l", "info"])
        proc.wait_for_log("beat: Starting...")
        return proc

    def ensure_worker(self, *, beat: bool = True) -> None:
        """Start a worker unless one of this environment's is alive."""
        alive = [p for p in self.procs if p.name == "worker" and p.popen.poll() is None]
        if not alive:
            self.start_worker(beat=beat)

    def start_agent(self, *args: str, extra_env: dict[str, str] | None = None) -> Proc:
        """An agent process: `fsm-celery agent ARGS`, or a script given as its first arg."""
        if args and args[0].endswith(".py"):
            argv = [sys.executable, str(ROOT / args[0]), *args[1:]]
        else:
            argv = [sys.executable, "-m", "fsm_celery", "agent", *args]
        return self._spawn("agent", argv, {**self.env, **(extra_env or {})})

    def wait_for_agents(self, count: int, timeout: float = 20.0) -> list[dict[str, Any]]:
        """The active agents, once at least count reported."""
        deadline = time.monotonic() + timeout
        while True:
            active = [a for a in self.client.agents() if a["status"] == "active"]
            if len(active) >= count:
                return active
            if time.monotonic() > deadline:
                raise AssertionError(f"{len(active)} of {count} agents reported active")
            time.sleep(0.1)

    def ensure_bridge(self) -> None:
        """Start a bridge unless one of this environment's is alive."""
        if not [p for p in self.procs if p.name == "bridge" and p.popen.poll() is None]:
            self.start_bridge()

    def start_bridge(self, processes: int = 1) -> Proc:
        """A real `fsm-celery ack-bridge`, returned once it serves (subscribed to the shared
        channel, where it accepts shared acks)."""
        channel = ack_channel(self.settings.channel_prefix)
        before = _subscribers(self.redis, channel)
        argv = [sys.executable, "-m", "fsm_celery", "ack-bridge", "--processes", str(processes)]
        proc = self._spawn("bridge", argv)
        if not self.settings.accept_shared_acks:
            proc.wait_for_log("ack bridge reading the ack streams")
            return proc
        deadline = time.monotonic() + 30
        while _subscribers(self.redis, channel) <= before:
            if time.monotonic() > deadline or proc.popen.poll() is not None:
                raise RuntimeError(
                    "ack bridge did not subscribe; log:\n" + proc.log.read_text(errors="replace")
                )
            time.sleep(0.05)
        return proc

    def start_flower(self, *args: str, basic_auth: str | None = None) -> tuple[Proc, int]:
        """A real `celery -A fsm_celery flower` on 127.0.0.1 (basic auth from the environment,
        as FLOWER_BASIC_AUTH), returned with its port once it serves."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [sys.executable, "-m", "celery", "-A", "fsm_celery", "flower"]
        argv += ["--address=127.0.0.1", f"--port={port}", *args]
        env = {**self.env, "FLOWER_BASIC_AUTH": basic_auth} if basic_auth else self.env
        proc = self._spawn("flower", argv, env)
        proc.wait_for_log("Visit me at")
        return proc, port

    def start_dashboard(self) -> tuple[Proc, str]:
        """A real `fsm-celery dashboard` on 127.0.0.1, returned with its base URL once it
        serves (tokens ADMIN_TOKEN and VIEWER_TOKEN)."""
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        argv = [sys.executable, "-m", "fsm_celery", "dashboard", "--port", str(port)]
        proc = self._spawn("dashboard", argv)
        proc.wait_for_log("Application startup complete")
        return proc, f"http://127.0.0.1:{port}"

    def api(self) -> Any:
        """The HTTP API in this process (FastAPI's TestClient: the real app, its real database
        and Redis, without a socket), asked over HTTPS as a deployment is (the session cookie
        is HTTPS-only); use it as a context manager to run the live feed."""
        from fastapi.testclient import TestClient

        from fsm_celery.http import create_app

        app = create_app(self.settings, self.client)
        return TestClient(app, base_url=API_BASE, raise_server_exceptions=False)

    def stop_all(self) -> None:
        for proc in self.procs:
            proc.stop()

    def wait_until_done(self, machine_id: uuid.UUID, timeout: float = 30.0) -> MachineInfo:
        """The machine once it reached a terminal status (fails the test on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                info = self.client.get_machine(machine_id)
            except OperationalError:  # the database is restarting: ask again
                time.sleep(0.2)
                continue
            if info.status in TERMINAL:
                return info
            if time.monotonic() > deadline:
                raise AssertionError(
                    f"machine {machine_id} still {info.status} in {info.current_state} "
                    f"(attempt {info.attempt}) after {timeout}s"
                )
            time.sleep(0.05)

    def wait_for_state(self, machine_id: uuid.UUID, state: str, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while self.client.get_machine(machine_id).current_state != state:
            if time.monotonic() > deadline:
                raise AssertionError(f"machine {machine_id} never reached {state}")
            time.sleep(0.05)

    def wait_for_rejections(
        self, machine_id: uuid.UUID | None, count: int, timeout: float = 15.0
    ) -> list[dict[str, Any]]:
        """The machine's rejected messages (oldest first) once there are at least count."""
        deadline = time.monotonic() + timeout
        while True:
            found = self.client.rejected(machine_id, limit=10_000)
            if len(found) >= count or time.monotonic() > deadline:
                return found[::-1]
            time.sleep(0.05)

    def visited(self, machine_id: uuid.UUID) -> list[str]:
        """The states the machine entered, in order, from its history."""
        return [row.to_state for row in self.client.history(machine_id)]


def _subscribers(client: redis.Redis, channel: str) -> int:
    return int(dict(client.pubsub_numsub(channel)).get(channel.encode(), 0))


def make_env(name: str, pg_url: str, template: str, redis_url: str, **overrides: Any) -> FsmEnv:
    """A fresh environment with its own database copied from the template."""
    tag = f"{name}_{os.getpid()}"
    database_url = copy_database(pg_url, template, f"fsm_test_{tag}")
    http = {
        "admin_token": ADMIN_TOKEN,
        "viewer_token": VIEWER_TOKEN,
        "github_webhook_secret": WEBHOOK_SECRET,
    }
    settings = Settings(
        database_url=database_url,
        redis_url=redis_url,
        queue=f"fsm-{tag}",
        channel_prefix=f"{tag}:",
        task_token_secret=TEST_SECRET,
        definitions_path=str(SHIPPED_DEFINITIONS),
        **{**http, **overrides},
    )
    client = wiring.client(settings)
    client.load_definitions(str(SHIPPED_DEFINITIONS))
    client.load_definitions(str(FIXTURE_DEFINITIONS))
    return FsmEnv(name, settings, redis.Redis.from_url(settings.redis_url), client)


def database_name(env: FsmEnv) -> str:
    return str(make_url(env.settings.database_url).database)


@contextmanager
def serving(agent: Agent) -> Iterator[Agent]:
    """The SDK agent running on a thread of the test process until the block ends."""
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.stop()
        thread.join(10)


# ---- agents -----------------------------------------------------------------------------

OUTPUTS: dict[str, dict[str, Any]] = {
    **MOCK_OUTPUTS,  # the shipped definitions' states
    "ONE": {"one": 1},
    "TWO": {"two": 2},
    "THREE": {"three": 3},
    "WAIT": {"answer": 42},
    "FALLBACK": {"fallback": True},
    "LONG": {"result": "done"},
    "FIRST": {"first": 1},
    "SECOND": {"second": 2},
}
FIX_BUG_STATES = [
    "ANALYZE_BUG",
    "LOCATE_CODE",
    "WRITE_FIX",
    "RUN_TESTS",
    "COMMIT_PUSH",
    "DEPLOY",
    "COMPLETE",
]


@dataclass(frozen=True)
class Reply:
    """How the agent answers one state_task: an ack (success, output), or silence."""

    success: bool = True
    output: dict[str, Any] | None = None  # None: the state's usual output
    silent: bool = False
    error: str | None = None
    heartbeat_for: float = 0.0  # send heartbeats this long first (every 0.3 s)


SILENT = Reply(silent=True)


class ScriptedAgent:
    """An agent written with plain redis-py: SUBSCRIBE to its channel, PUBLISH JSON acks."""

    def __init__(
        self,
        env: FsmEnv,
        script: dict[str, list[Reply]] | None = None,
        copies: int = 1,
        gate: threading.Event | None = None,
        via_stream: bool = False,
        own_stream: bool = False,
    ) -> None:
        self.id = str(uuid.uuid4())
        self.env = env
        self.script = {state: list(replies) for state, replies in (script or {}).items()}
        self.copies = copies
        self.gate = gate
        self.via_stream = via_stream
        self.own_stream = own_stream  # its own ack stream: the engine knows who sent it
        self.tasks: list[dict[str, Any]] = []
        self._pending: list[str] = []
        self._redis = redis.Redis.from_url(env.settings.redis_url)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ScriptedAgent:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("agent did not subscribe")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(task_channel(self.id, self.env.settings.channel_prefix))
        self._ready.set()
        while not self._stop.is_set():
            message = pubsub.get_message(timeout=0.05)
            if message is not None:
                self._answer(json.loads(message["data"]))
            if self._pending and self.gate is not None and self.gate.is_set():
                for ack in self._pending:
                    self._publish(ack)
                self._pending.clear()
        pubsub.close()

    def _answer(self, task: dict[str, Any]) -> None:
        self.tasks.append(task)
        replies = self.script.get(task["state"])
        reply = replies.pop(0) if replies else Reply()
        beat_until = time.monotonic() + reply.heartbeat_for
        while time.monotonic() < beat_until:
            self.send(heartbeat_for(task, f"{beat_until - time.monotonic():.1f}s to go"))
            time.sleep(0.3)
        if reply.silent:
            return
        ack = json.dumps(ack_for(task, reply))
        if self.gate is not None and not self.gate.is_set():
            self._pending.append(ack)  # held until the gate opens
        else:
            self._publish(ack)

    def _publish(self, ack: str) -> None:
        for _ in range(self.copies):
            self.send(ack)

    def send(self, message: str | dict[str, Any]) -> None:
        """Send a raw message the way this agent does (PUBLISH, or XADD to the ack stream)."""
        text = message if isinstance(message, str) else json.dumps(message)
        prefix = self.env.settings.channel_prefix
        if self.own_stream:
            self._redis.xadd(agent_ack_stream(self.id, prefix), {"message": text})
        elif self.via_stream:
            self._redis.xadd(ack_stream(prefix), {"message": text})
        else:
            self._redis.publish(ack_channel(prefix), text)

    def wait_for_tasks(self, count: int, timeout: float = 15.0) -> dict[str, Any]:
        """The count-th state_task this agent received, once it arrived."""
        deadline = time.monotonic() + timeout
        while len(self.tasks) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"agent received {len(self.tasks)} of {count} tasks")
            time.sleep(0.02)
        return self.tasks[count - 1]

    def states(self) -> Iterator[str]:
        return (task["state"] for task in self.tasks)


def heartbeat_for(task: dict[str, Any], progress: str | None = None) -> dict[str, Any]:
    """A state_heartbeat for the task's attempt."""
    beat = {
        "type": "state_heartbeat",
        "machineId": task["machineId"],
        "state": task["state"],
        "attempt": task["attempt"],
        "taskToken": task["taskToken"],
    }
    return beat if progress is None else {**beat, "progress": progress}


def ack_for(task: dict[str, Any], reply: Reply = Reply()) -> dict[str, Any]:
    """The state_ack answering a state_task."""
    ack: dict[str, Any] = {
        "type": "state_ack",
        "machineId": task["machineId"],
        "state": task["state"],
        "success": reply.success,
        "output": OUTPUTS.get(task["state"], {}) if reply.output is None else reply.output,
        "attempt": task["attempt"],
        "taskToken": task["taskToken"],
    }
    if reply.error is not None:
        ack["error"] = reply.error
    return ack


def dispatches(env: FsmEnv, agent_id: str) -> dict[tuple[str, int], int]:
    """How many state_tasks the agent's stream holds for each (machine, attempt)."""
    stream = task_stream(agent_id, env.settings.channel_prefix)
    counts: dict[tuple[str, int], int] = {}
    for _, fields in env.redis.xrange(stream):
        task = json.loads(fields[b"message"])
        if task["type"] != "state_task":
            continue
        key = (task["machineId"], task["attempt"])
        counts[key] = counts.get(key, 0) + 1
    return counts
