"""A RabbitMQ node of the tests' own (Debian's rabbitmq-server), for the tests of Celery on
RabbitMQ: started lazily by the tests that ask for it, one per test process, stopped at the end.

Everything it is and keeps is in its temporary folder: its node name, its AMQP and
distribution ports (free ones), its database and logs, its config, the enabled plugins (none)
and HOME (where Erlang keeps the node's cookie). It shares only the host's epmd, the name
server Erlang nodes register with, on which its name is its own. A RabbitMQ the system runs
(the package starts one on 5672 when installed) is never used nor touched.

It can be stopped and started again on the same ports and folder: its durable quorum queues
come back with their messages.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from celery import Celery
from kombu import Connection

from fsm_celery.config import Settings
from fsm_celery.worker.broker import all_queues, task_queue
from fsm_celery.worker.enqueue import Enqueue
from tests.support.processes import FsmEnv
from tests.support.services import HOST, free_port, worker_name

SERVER = "/usr/lib/rabbitmq/bin/rabbitmq-server"  # the script, not /usr/sbin's wrapper (su)
START_SECONDS = 90.0  # a cold start takes ~5 s here, far more on a loaded CI box


def _server_binary() -> str:
    if Path(SERVER).exists():
        return SERVER
    found = shutil.which("rabbitmq-server")
    if found is None:
        raise RuntimeError(
            "the RabbitMQ tests start a rabbitmq-server of their own and it is not installed "
            "(Debian: rabbitmq-server)"
        )
    return found


@dataclass
class RabbitMQ:
    """One throwaway node: `url` is its AMQP URL (guest, from loopback only)."""

    directory: Path
    name: str
    port: int
    dist_port: int
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls, directory: Path, name: str = "", cookie: str = "") -> RabbitMQ:
        """A node (name: its own unless given; cookie: the Erlang cookie nodes of one cluster
        share, else one of its own)."""
        directory.mkdir(parents=True, exist_ok=True)
        name = name or f"fsm-test-{worker_name()}-{os.getpid()}@localhost"
        node = cls(directory, name, free_port(), free_port())
        if cookie:
            path = directory / ".erlang.cookie"
            path.write_text(cookie)
            path.chmod(0o400)
        (directory / "rabbitmq.conf").write_text(
            f"listeners.tcp.default = {HOST}:{node.port}\n"
            "log.console = false\nlog.file.level = warning\n"
        )
        (directory / "enabled_plugins").write_text("[].\n")
        (directory / "rabbitmq-env.conf").write_text("")  # not /etc/rabbitmq's
        try:
            node.run()
        except BaseException:
            node.stop()
            raise
        return node

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@{HOST}:{self.port}//"

    def _environment(self) -> dict[str, str]:
        folder = self.directory
        return {
            **os.environ,
            "HOME": str(folder),  # the Erlang cookie, written on first start
            "RABBITMQ_NODENAME": self.name,
            "RABBITMQ_NODE_IP_ADDRESS": HOST,
            "RABBITMQ_NODE_PORT": str(self.port),
            "RABBITMQ_DIST_PORT": str(self.dist_port),
            "RABBITMQ_MNESIA_BASE": str(folder / "mnesia"),
            "RABBITMQ_LOG_BASE": str(folder / "log"),
            "RABBITMQ_CONFIG_FILE": str(folder / "rabbitmq.conf"),
            "RABBITMQ_ADVANCED_CONFIG_FILE": str(folder / "advanced.config"),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(folder / "enabled_plugins"),
            "RABBITMQ_PLUGINS_EXPAND_DIR": str(folder / "plugins-expand"),
            "RABBITMQ_CONF_ENV_FILE": str(folder / "rabbitmq-env.conf"),
            "RABBITMQ_PID_FILE": str(folder / "rabbitmq.pid"),
        }

    def run(self) -> None:
        """Start the node (again, after stop: the same ports, database and queues)."""
        with (self.directory / "server.log").open("ab") as out:
            self.process = subprocess.Popen(
                [_server_binary()],
                env=self._environment(),
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # its shell and Erlang's processes: one group to stop
            )
        self._wait()

    def _wait(self) -> None:
        deadline = time.monotonic() + START_SECONDS
        while True:
            assert self.process is not None
            if self.process.poll() is not None:
                tail = (self.directory / "server.log").read_text(errors="replace")[-3000:]
                code = self.process.returncode
                raise RuntimeError(f"rabbitmq-server exited with {code}:\n{tail}")
            if self._answers():
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"rabbitmq-server did not answer on {self.port} in time")
            time.sleep(0.2)

    def _answers(self) -> bool:
        try:
            with socket.create_connection((HOST, self.port), timeout=1):
                pass
            with Connection(self.url, connect_timeout=2) as conn:
                conn.connect()
            return True
        except Exception:
            return False

    def stop(self) -> None:
        """Stop the node (SIGTERM: RabbitMQ's orderly shutdown), its queues kept on disk."""
        if self.process is None:
            return
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait()
        self.process = None
        # The shell that ran it may exit before Erlang does: wait for the port to be free.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _listening(self.port):
            time.sleep(0.1)

    def restart(self, down: float = 0.0) -> None:
        """Stop, stay down for `down` seconds, start again."""
        self.stop()
        time.sleep(down)
        self.run()

    def crash(self) -> None:
        """SIGKILL the node (its shell and Erlang VM: no orderly shutdown; its queues as it
        persisted them), then start it again on the same ports."""
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait()
        self.process = None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and _listening(self.port):
            time.sleep(0.1)
        self.run()

    def queue_length(self, name: str) -> int:
        """The ready messages of a queue (0 when it is not there)."""
        from amqp.exceptions import NotFound

        with Connection(self.url, connect_timeout=5) as conn:
            try:
                return int(conn.channel().queue_declare(name, passive=True).message_count)
            except NotFound:
                return 0

    def ctl(self, *args: str) -> str:
        """rabbitmqctl on this node; its output."""
        done = subprocess.run(
            [_ctl(), "-n", self.name, *args],
            env=self._environment(),
            capture_output=True,
            text=True,
            timeout=120,
            check=True,
        )
        return done.stdout

    def queue_type(self, name: str) -> str:
        """A declared queue's type as RabbitMQ reports it (rabbitmqctl): quorum, classic."""
        argv = [_ctl(), "-n", self.name, "list_queues", "-q", "--no-table-headers", "name", "type"]
        done = subprocess.run(
            argv, env=self._environment(), capture_output=True, text=True, timeout=60, check=True
        )
        for line in done.stdout.splitlines():
            queue, _, kind = line.partition("\t")
            if queue == name:
                return kind.strip()
        raise KeyError(f"no queue {name!r}: {done.stdout}")


def _ctl() -> str:
    return str(Path(_server_binary()).with_name("rabbitmqctl"))


def _listening(port: int) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=0.5):
            return True
    except OSError:
        return False


def celery_app(settings: Settings) -> Celery:
    """A Celery app of the test process that sends to the deployment's RabbitMQ, its queues
    declared as the deployment's celeryconfig declares them (quorum: a queue declared twice
    must be declared alike). The test process's own app sends to the suite's Redis."""
    app = Celery(f"fsm-test-{settings.queue}", set_as_current=False)
    app.conf.update(
        broker_url=settings.celery_broker_url,
        broker_transport_options=settings.celery_transport_options,
        task_queues=[task_queue(settings, name) for name in all_queues(settings)],
        task_default_queue=settings.queue,
        task_default_exchange="",
        task_default_routing_key=settings.queue,
        task_serializer="json",
        accept_content=["json"],
        task_ignore_result=True,
    )
    return app


def on_rabbitmq(env: FsmEnv) -> FsmEnv:
    """The deployment's client sending to its RabbitMQ (its processes read FSM_BROKER_URL)."""
    env.client.enqueue = Enqueue(env.settings, celery_app(env.settings))
    return env
