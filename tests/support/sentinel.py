"""A Redis primary, a replica and three sentinels of a test's own, on loopback ports: real
redis-server processes (a sentinel is redis-server in sentinel mode), persisting nothing.

The test kills the primary (SIGKILL) and waits for the sentinels to promote the replica; it
brings the old primary back on its port, and the sentinels make it a replica of the new one.
"""

from __future__ import annotations

import signal
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from tests.support.services import HOST, free_port, start_redis, stop_redis, wait_for_redis

MASTER = "fsm"
DOWN_AFTER_MS = 1000  # a primary silent this long is down, for each sentinel
QUORUM = 2


@dataclass
class Node:
    directory: Path
    port: int
    process: subprocess.Popen[bytes]


@dataclass
class SentinelCluster:
    directory: Path
    nodes: list[Node] = field(default_factory=list)  # the data nodes: the first started primary
    sentinels: list[Node] = field(default_factory=list)

    @classmethod
    def start(cls, directory: Path) -> SentinelCluster:
        cluster = cls(directory)
        try:
            primary = cluster._node("primary")
            cluster._node("replica", "--replicaof", HOST, str(primary.port))
            cluster.wait_for_replica(primary.port)
            for i in range(3):
                cluster._sentinel(i, primary.port)
            cluster.wait_for_sentinels()
        except BaseException:
            cluster.stop()
            raise
        return cluster

    def _node(self, name: str, *extra: str, port: int | None = None) -> Node:
        directory = self.directory / name
        directory.mkdir(parents=True, exist_ok=True)
        process, port = start_redis(directory, *extra, port=port)
        node = Node(directory, port, process)
        self.nodes.append(node)
        return node

    def _sentinel(self, index: int, primary_port: int) -> None:
        directory = self.directory / f"sentinel{index}"
        directory.mkdir(parents=True, exist_ok=True)
        port = free_port()
        config = directory / "sentinel.conf"  # the sentinel rewrites it: its own, writable
        config.write_text(
            f"port {port}\nbind {HOST}\ndir {directory}\nlogfile {directory / 'redis.log'}\n"
            f"sentinel monitor {MASTER} {HOST} {primary_port} {QUORUM}\n"
            f"sentinel down-after-milliseconds {MASTER} {DOWN_AFTER_MS}\n"
            f"sentinel failover-timeout {MASTER} 10000\n"
            f"sentinel parallel-syncs {MASTER} 1\n"
        )
        process = subprocess.Popen(
            ["redis-server", str(config), "--sentinel"],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        wait_for_redis(process, port, directory)
        self.sentinels.append(Node(directory, port, process))

    @property
    def url(self) -> str:
        """The redis+sentinel:// URL of the primary, database 0."""
        hosts = ",".join(f"{HOST}:{s.port}" for s in self.sentinels)
        return f"redis+sentinel://{hosts}/{MASTER}/0"

    def primary_port(self) -> int:
        """The port of the primary the sentinels name now."""
        with redis.Redis(host=HOST, port=self.sentinels[0].port, socket_timeout=2) as s:
            _, port = s.sentinel_get_master_addr_by_name(MASTER)
        return int(port)

    def node(self, port: int) -> Node:
        return next(n for n in self.nodes if n.port == port)

    def wait_for_replica(self, primary_port: int, timeout: float = 15.0) -> None:
        """Until the primary has a replica in sync."""
        deadline = time.monotonic() + timeout
        with redis.Redis(host=HOST, port=primary_port, socket_timeout=2) as client:
            while int(client.info("replication").get("connected_slaves", 0)) < 1:
                if time.monotonic() > deadline:
                    raise RuntimeError("the replica did not connect to the primary")
                time.sleep(0.05)

    def wait_for_sentinels(self, timeout: float = 15.0) -> None:
        """Until every sentinel knows the replica and the other sentinels."""
        deadline = time.monotonic() + timeout
        for sentinel in self.sentinels:
            with redis.Redis(host=HOST, port=sentinel.port, socket_timeout=2) as s:
                while True:
                    state = s.sentinel_master(MASTER)
                    if state["num-slaves"] >= 1 and state["num-other-sentinels"] >= 2:
                        break
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"sentinel on {sentinel.port} did not see its peers")
                    time.sleep(0.1)

    def kill_primary(self) -> Node:
        """SIGKILL the primary the sentinels name now; returns it."""
        node = self.node(self.primary_port())
        node.process.send_signal(signal.SIGKILL)
        node.process.wait(10)
        return node

    def wait_for_failover(self, old_port: int, timeout: float = 30.0) -> int:
        """Until the sentinels name another primary; its port."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                port = self.primary_port()
            except redis.RedisError:
                port = old_port
            if port != old_port:
                return port
            time.sleep(0.05)
        raise RuntimeError("the sentinels promoted no replica")

    def bring_back(self, node: Node) -> None:
        """Start a killed node again on its port (empty: the sentinels make it a replica of
        the primary they name now, and it syncs from it)."""
        node.process, _ = start_redis(node.directory, port=node.port)

    def wait_for_rejoin(self, port: int, timeout: float = 30.0) -> None:
        """Until the node on that port is back in the pair: a replica in sync with the primary,
        or, when a loaded box made the sentinels fail over a second time once it had synced,
        the primary they name with its replica connected."""
        deadline = time.monotonic() + timeout
        with redis.Redis(host=HOST, port=port, socket_timeout=2) as client:
            while True:
                info = client.info("replication")
                if info.get("role") == "slave" and info.get("master_link_status") == "up":
                    return
                if self._named_primary_with_replica(port, info):
                    return
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the node on {port} did not rejoin as a replica: {info}")
                time.sleep(0.1)

    def _named_primary_with_replica(self, port: int, info: dict[str, Any]) -> bool:
        if info.get("role") != "master" or int(info.get("connected_slaves", 0)) < 1:
            return False
        try:
            return self.primary_port() == port
        except redis.RedisError:
            return False

    def stop(self) -> None:
        for node in [*self.sentinels, *self.nodes]:
            if node.process.poll() is None:
                stop_redis(node.process)
