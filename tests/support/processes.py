"""Deployments of real processes: each has its own PostgreSQL database (a copy of a migrated
template), its own Celery queue and channel prefix on the test Redis, and real `celery worker`,
`celery beat`, `fsm-celery ack-bridge`, agent, Flower and dashboard processes, logging into
LOGS (a folder per test process)."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from sqlalchemy.engine import make_url
from sqlalchemy.exc import OperationalError

from fsm_celery import wiring
from fsm_celery.channel.redis import connect
from fsm_celery.client import Client, MachineInfo
from fsm_celery.config import Settings
from fsm_celery.core.loader import SHIPPED_DEFINITIONS
from fsm_celery.core.messages import ack_channel
from tests.support import FIXTURE_DEFINITIONS, ROOT
from tests.support.credentials import ADMIN_TOKEN, TEST_SECRET, VIEWER_TOKEN, WEBHOOK_SECRET
from tests.support.databases import copy_database
from tests.support.services import worker_name

LOG_ROOT = Path(os.environ.get("FSM_TEST_LOGS", "/tmp/fsm-celery-test-logs"))
# The processes' logs (and beat's schedule files), kept after the run to read: a folder per test
# process (xdist worker and pid), as the deployments' names repeat in each worker and in each
# run of the suite side by side (another checkout's).
LOGS = LOG_ROOT / f"{worker_name()}-{os.getpid()}"
API_BASE = "https://testserver"  # what env.api() asks: the dashboard behind TLS
TERMINAL = {"completed", "failed", "cancelled"}


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

    def terminate(self) -> None:
        """Ask it to stop (SIGTERM to its process group), without waiting."""
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, signal.SIGTERM)

    def stop(self) -> None:
        if self.popen.poll() is None:
            self.terminate()
            try:
                self.popen.wait(timeout=15)
            except subprocess.TimeoutExpired:
                self.kill()

    def wait_for_log(self, needle: str, timeout: float = 30.0, times: int = 1) -> None:
        """Until the log holds `needle` (`times` times: once per process that writes it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.log.read_text(errors="replace").count(needle) >= times:
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
        return {**os.environ, **{f"FSM_{k.upper()}": _env_value(v) for k, v in fields.items()}}

    def _spawn(self, name: str, argv: list[str], env: dict[str, str] | None = None) -> Proc:
        _open_logs()
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
        log_level: str = "info",
        queues: list[str] | None = None,
    ) -> Proc:
        """A real `celery worker` on this environment's queue (with beat, which sends the scan).
        At a log level past info (README.md's workers log warnings only: the benchmarks run
        them so) it logs no line to say it is ready: it is asked, by a remote-control ping.

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
            ",".join(queues or [self.settings.queue]),
            "-c",
            str(concurrency),
            "-P",
            pool,
            "-l",
            log_level,
            "--without-mingle",
            "--without-gossip",
            "-n",
            f"{self.name}-{uuid.uuid4().hex[:6]}@%h",
        ]
        name = argv[-1].replace("%h", socket.gethostname())
        if beat:
            argv += ["-B", "-s", str(LOGS / f"{self.name}-beat-{uuid.uuid4().hex[:6]}")]
        if supervised:
            argv = ["bash", "-c", f"while true; do {shlex.join(argv)}; sleep 0.5; done"]
        proc = self._spawn("worker", argv)
        if log_level == "info":
            proc.wait_for_log(" ready.")
        else:
            self._wait_for_ping(proc, name)
        return proc

    def _wait_for_ping(self, proc: Proc, name: str, timeout: float = 30.0) -> None:
        """Until the worker named answers a remote-control ping (it consumes by then)."""
        from celery import Celery

        app = Celery(broker=self.settings.celery_broker_url)
        app.conf.broker_transport_options = self.settings.celery_transport_options
        deadline = time.monotonic() + timeout
        try:
            while not app.control.ping(destination=[name], timeout=0.5):
                if proc.popen.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the worker {name} did not start: see {proc.log}")
        finally:
            app.close()

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

    def issue_credentials(self, agent_id: str, agent_type: str) -> str:
        """`fsm-celery agents credentials ID --type T --apply`: the agent's Redis user created;
        the URL it was issued."""
        argv = ["agents", "credentials", agent_id, "--type", agent_type, "--apply"]
        done = subprocess.run(
            [sys.executable, "-m", "fsm_celery", *argv],
            cwd=ROOT,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        url = re.search(r"^redis://\S+", done.stdout, re.MULTILINE)
        assert url is not None, done.stdout
        return url.group(0)

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

    def start_bridge(
        self, processes: int = 1, *flags: str, env: dict[str, str] | None = None
    ) -> Proc:
        """A real `fsm-celery ack-bridge` (with the flags, in the environment given), returned
        once it serves: every one of its processes reading the ack streams (a benchmark's clock
        must not start while one is still importing), subscribed to the shared channel where it
        accepts shared acks."""
        channel = ack_channel(self.settings.channel_prefix)
        before = _subscribers(self.redis, channel)
        argv = [sys.executable, "-m", "fsm_celery", "ack-bridge", "--processes", str(processes)]
        proc = self._spawn("bridge", [*argv, *flags], env)
        proc.wait_for_log("ack bridge reading the ack streams", 60, times=processes)
        if not self.settings.accept_shared_acks:
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
        """Stop every process, all asked at once (each may take seconds to finish its work)."""
        for proc in self.procs:
            proc.terminate()
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
                    f"(attempt {info.attempt}) after {timeout}s; its last steps: "
                    f"{self._last_steps(machine_id)}"
                )
            time.sleep(0.05)

    def _last_steps(self, machine_id: uuid.UUID, most: int = 5) -> str:
        """The machine's last history rows, for a failure's message (why did it move back?)."""
        try:
            rows = self.client.history(machine_id)[-most:]
        except OperationalError as exc:  # the database is away: the timeout is the news
            return f"unread ({type(exc).__name__})"
        steps = []
        for r in rows:
            notes = (("error", r.error_message), ("reason", r.reason))
            said = (f" {k}={v!r}" for k, v in notes if v)
            steps.append(f"{r.attempt} {r.event} {r.from_state}->{r.to_state}" + "".join(said))
        return "; ".join(steps)

    def wait_for_state(self, machine_id: uuid.UUID, state: str, timeout: float = 15.0) -> None:
        """Until the machine has reached the state: it is there, or its history shows it
        entered it (a fast agent may have moved it on between two looks)."""
        deadline = time.monotonic() + timeout
        while self.client.get_machine(machine_id).current_state != state:
            if state in self.visited(machine_id):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"machine {machine_id} never reached {state}")
            time.sleep(0.05)

    def wait_for_gate(self, machine_id: uuid.UUID, state: str, timeout: float = 60.0) -> None:
        """Wait until the machine's gate at the state is open. Not merely the state: the celery
        mode moves a machine there with the ack and opens its gate when the fsm.enter_state
        task enters it, a transaction later (seconds, on a loaded box); a decision in between
        is refused ("not open (yet)"), so deciding as soon as the state showed could leave
        every decision refused and the machine waiting at its gate."""
        self.wait_for_state(machine_id, state, timeout)
        deadline = time.monotonic() + timeout
        while not any(
            gate["state"] == state and gate["closed_at"] is None
            for gate in self.client.decisions(machine_id)["gates"]
        ):
            if time.monotonic() > deadline:
                raise AssertionError(f"machine {machine_id} opened no gate at {state}")
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


def _env_value(value: Any) -> str:
    """A setting as an environment variable holds it: a mapping or a list as JSON."""
    return json.dumps(value) if isinstance(value, dict | list | tuple) else str(value)


def _open_logs() -> None:
    """Make this process's log folder, removing those of test processes that have ended."""
    if LOGS.is_dir():
        return
    for folder in LOG_ROOT.glob("*-*"):
        pid = folder.name.rpartition("-")[2]
        if folder.is_dir() and pid.isdigit() and not _alive(int(pid)):
            shutil.rmtree(folder, ignore_errors=True)
    LOGS.mkdir(parents=True, exist_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's
        return True
    return True


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
    return FsmEnv(name, settings, connect(settings.redis_url), client)


def database_name(env: FsmEnv) -> str:
    return str(make_url(env.settings.database_url).database)
