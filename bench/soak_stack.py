"""The soak's deployment (bench/soak.py): a PostgreSQL of its own, Redis behind Sentinel (a
primary, a replica, three sentinels), and every long-lived process of production, started from
the suite's support code (tests/support/) and killed and started again by the faults. The
shipped definitions' schedules are paused: every machine of the run is one the soak started.

Each process kind but beat runs twice: a steady copy no fault touches, whose memory over the
whole run is what "flat" is judged on, and a faulty copy the faults kill (SIGKILL to its process
group) and start again. Beat runs once (two would each send the scan) and is killed like the
faulty copies. A process that exits by itself is started again too, and counted: no process of
the product should.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.support import ROOT
from tests.support.databases import create_template
from tests.support.processes import FsmEnv, Proc, make_env
from tests.support.rabbitmq import RabbitMQ
from tests.support.sentinel import SentinelCluster
from tests.support.services import HOST, Postgres

AGENT_SCRIPT = "tests/integration/fan_agent.py"  # answers every task at once, after THINK
AGENT_THINK = "0.3"
AGENT_TYPE = "soak"  # every soak definition's (bench/definitions/soak_*.yaml)
TEMPLATE = "template_soak"


class BrokerUnavailable(RuntimeError):
    """The soak was asked for a fault its broker does not have."""


@dataclass
class Role:
    """One long-lived process of the deployment: its kind, whether faults may kill it, and the
    process running it now."""

    name: str
    kind: str  # worker, beat, bridge, agent, dashboard
    steady: bool
    proc: Proc | None = None
    url: str = ""  # a dashboard's
    kills: int = 0
    exits: list[str] = field(default_factory=list)  # exits of its own: code and log


@dataclass
class Stack:
    """The servers, the deployment on them, and its processes by role."""

    directory: Path
    postgres: Postgres
    cluster: SentinelCluster
    env: FsmEnv
    broker: RabbitMQ | None = None
    roles: list[Role] = field(default_factory=list)
    agent_ids: dict[str, str] = field(default_factory=dict)  # role name -> its fixed id

    @classmethod
    def start(cls, mode: str, broker: str) -> Stack:
        """The servers and a deployment in the transition mode; no process started yet."""
        directory = Path(tempfile.mkdtemp(prefix="fsm-celery-soak-"))
        postgres = Postgres(directory / "postgres").init().start()
        cluster = SentinelCluster.start(directory / "redis")
        stack = cls(directory, postgres, cluster, env=None)  # type: ignore[arg-type]
        try:
            if broker == "amqp":  # Celery's broker on a RabbitMQ node of the soak's own
                node = f"soak-{os.getpid()}@localhost"
                stack.broker = RabbitMQ.start(directory / "rabbitmq", name=node)
            create_template(postgres.url, TEMPLATE)
            overrides: dict[str, Any] = {
                "transition_mode": mode,
                "redis_replicas": 1,  # a state_task or ack counts as sent once a replica has it
                "stream_claim_idle_seconds": 1.0,
                "dispatch_grace_seconds": 2.0,
                "visibility_timeout_seconds": 10,
            }
            if stack.broker is not None:
                overrides["broker_url"] = stack.broker.url
            stack.env = make_env(f"soak_{mode}", postgres.url, TEMPLATE, cluster.url, **overrides)
            stack.env.client.load_definitions(str(ROOT / "bench" / "definitions"))
            for found in stack.env.client.schedules():  # beat starts the soak's machines only
                ref = f"{found.machine_type}/{found.name}"
                stack.env.client.pause_schedule(ref, "soak", "the soak runs its own load")
        except BaseException:
            stack.stop()
            raise
        return stack

    def start_processes(self) -> None:
        """Every role's process, the agents reported before any machine starts."""
        for kind, copies in (
            ("bridge", ("steady", "faulty")),
            ("worker", ("steady", "faulty")),
            ("beat", ("faulty",)),
            ("agent", ("steady", "faulty")),
            ("dashboard", ("steady", "faulty")),
        ):
            for copy in copies:
                role = Role(f"{kind}.{copy}", kind, copy == "steady")
                if kind == "agent":
                    self.agent_ids[role.name] = str(uuid.uuid4())
                self.roles.append(role)
                self._start(role)
        self.env.wait_for_agents(2, timeout=60)

    def _start(self, role: Role) -> None:
        starters: dict[str, Callable[[Role], Proc]] = {
            "worker": lambda _: self.env.start_worker(beat=False),
            "beat": lambda _: self.env.start_beat(),
            "bridge": lambda _: self.env.start_bridge(),
            "agent": self._start_agent,
            "dashboard": self._start_dashboard,
        }
        spawned = len(self.env.procs)
        try:
            role.proc = starters[role.kind](role)
        except BaseException:
            for proc in self.env.procs[spawned:]:  # half started: never left running untracked
                proc.kill()
            raise

    def _start_agent(self, role: Role) -> Proc:
        return self.env.start_agent(
            AGENT_SCRIPT,
            AGENT_TYPE,
            self.agent_ids[role.name],
            extra_env={"FAN_AGENT_THINK": AGENT_THINK},
        )

    def _start_dashboard(self, role: Role) -> Proc:
        proc, role.url = self.env.start_dashboard()
        return proc

    def kill(self, kind: str) -> None:
        """SIGKILL the faulty process of the kind (its whole process group), start another."""
        role = next(r for r in self.roles if r.kind == kind and not r.steady)
        if role.proc is not None:
            role.proc.kill()
        role.kills += 1
        role.proc = None
        self._start(role)

    def revive(self) -> list[str]:
        """Start again every process that is not running (one that exited by itself is
        recorded as such); the roles that could not be started yet (a server restarting)."""
        failed = []
        for role in self.roles:
            proc = role.proc
            if proc is not None and proc.popen.poll() is None:
                continue
            if proc is not None:
                role.exits.append(f"exit {proc.popen.returncode}: {proc.log.name}")
                role.proc = None
            try:
                self._start(role)
            except Exception as exc:  # the next revive tries again
                failed.append(f"{role.name}: {exc}"[:300])
        return failed

    def flush_redis(self) -> None:
        """FLUSHALL on the primary (the replica follows): everything in Redis is lost."""
        with redis.Redis(host=HOST, port=self.cluster.primary_port(), socket_timeout=5) as r:
            r.flushall()

    def fail_over(self) -> None:
        """SIGKILL the primary; once the sentinels promoted the replica, the old primary back
        (empty), a replica of the new one."""
        old = self.cluster.kill_primary()
        self.cluster.wait_for_failover(old.port, timeout=60)
        self.cluster.bring_back(old)
        self.cluster.wait_for_rejoin(old.port, timeout=60)

    def restart_postgres(self) -> None:
        self.postgres.restart()

    def restart_broker(self) -> None:
        if self.broker is None:
            raise BrokerUnavailable("broker_restart is a fault of --broker amqp only")
        self.broker.crash()

    def carry_out(self, kind: str) -> None:
        """One fault of the kind (bench/soak_faults.py names them)."""
        actions: dict[str, Callable[[], None]] = {
            "redis_flush": self.flush_redis,
            "postgres_restart": self.restart_postgres,
            "sentinel_failover": self.fail_over,
            "broker_restart": self.restart_broker,
        }
        if kind.startswith("kill_"):
            self.kill(kind.removeprefix("kill_"))
        else:
            actions[kind]()

    def stop(self) -> None:
        """Every process, then the servers; the directory removed (the logs are kept)."""
        env: FsmEnv | None = self.env
        if env is not None:
            env.stop_all()
            env.client.engine.db.dispose()
        self.cluster.stop()
        if self.broker is not None:
            self.broker.stop()
        self.postgres.stop()
        shutil.rmtree(self.directory, ignore_errors=True)
