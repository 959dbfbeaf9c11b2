"""A three-node RabbitMQ cluster losing a node under load: one quorum queue (three replicas),
its leader SIGKILLed mid-run; how many confirmed messages were lost, how many came twice.

    .venv/bin/python -m bench.rabbit_cluster [--messages 20000] [--kill-after 5000]

Three local nodes of Debian's rabbitmq-server (tests/support/rabbitmq.py: own names, ports and
folders, one Erlang cookie) are joined into one cluster. A publisher sends numbered persistent
messages with publisher confirms (what FSM_BROKER_URL=amqp:// sets for Celery), over a failover
list of the three nodes, and counts a number as sent once its publish is confirmed (a publish
that failed is sent again, as the ack bridge sends a batch again). A consumer acknowledges each
message after recording its number (late acks, as the workers do). Once kill-after numbers are
confirmed, the node leading the queue is SIGKILLed. Lost: a confirmed number never received.
Doubled: a number received more than once (a message sent again after its confirm was lost, or
redelivered after its ack was: harmless for the fsm tasks, which are idempotent, but counted).
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import kombu.connection
import kombu.entity

from bench.common import write_result
from tests.support.rabbitmq import RabbitMQ

QUEUE = "bench.cluster"
Connection: Any = kombu.connection.Connection
ARGUMENTS = {"x-queue-type": "quorum", "x-quorum-initial-group-size": 3}


def start_cluster(folder: Path) -> list[RabbitMQ]:
    """Three nodes, the second and third joined to the first."""
    cookie = secrets.token_hex(16).upper()
    nodes = [
        RabbitMQ.start(folder / n, f"fsm-bench-{n}-{os.getpid()}@localhost", cookie)
        for n in ("a", "b", "c")
    ]
    for node in nodes[1:]:
        node.ctl("stop_app")
        node.ctl("join_cluster", nodes[0].name)
        node.ctl("start_app")
    return nodes


def failover(nodes: list[RabbitMQ]) -> str:
    return ";".join(node.url for node in nodes)


def queue() -> Any:
    exchange = kombu.entity.Exchange("", type="direct")
    return kombu.entity.Queue(
        QUEUE, exchange, routing_key=QUEUE, durable=True, queue_arguments=ARGUMENTS
    )


def leader(nodes: list[RabbitMQ]) -> RabbitMQ:
    """The node leading the queue now (rabbitmqctl, asked of a node alive)."""
    out = nodes[0].ctl("list_queues", "-q", "--no-table-headers", "name", "leader")
    for line in out.splitlines():
        name, _, lead = line.partition("\t")
        if name == QUEUE:
            return next(n for n in nodes if n.name == lead.strip())
    raise RuntimeError(f"no leader found for {QUEUE}: {out}")


class Publisher(threading.Thread):
    def __init__(self, url: str, messages: int) -> None:
        super().__init__(daemon=True)
        self.url, self.messages = url, messages
        self.confirmed: list[int] = []
        self.sent_again = 0

    def run(self) -> None:
        options = {"confirm_publish": True}
        policy = {"max_retries": 60, "interval_start": 0.2, "interval_step": 0.2, "interval_max": 1}
        with Connection(self.url, transport_options=options, heartbeat=10) as conn:
            producer = conn.Producer()
            number = 0
            while number < self.messages:
                try:
                    producer.publish(
                        {"n": number},
                        exchange="",
                        routing_key=QUEUE,
                        delivery_mode=2,
                        declare=[queue()],
                        retry=True,
                        retry_policy=policy,
                    )
                except Exception:  # not confirmed: sent again, as the bridge would
                    self.sent_again += 1
                    time.sleep(0.2)
                    continue
                self.confirmed.append(number)
                number += 1


class Consumer(threading.Thread):
    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.received: Counter[int] = Counter()
        self.reconnects = 0
        self.stop = threading.Event()

    def _take(self, body: dict[str, int], message: Any) -> None:
        self.received[int(body["n"])] += 1
        message.ack()

    def run(self) -> None:
        while not self.stop.is_set():
            try:
                self._consume()
            except Exception:
                self.reconnects += 1
                time.sleep(0.5)

    def _consume(self) -> None:
        with Connection(self.url, heartbeat=10) as conn:
            consumer = conn.Consumer([queue()], callbacks=[self._take], accept=["json"])
            consumer.qos(prefetch_count=64)
            with consumer:
                while not self.stop.is_set():
                    try:
                        conn.drain_events(timeout=1)
                    except TimeoutError:
                        conn.heartbeat_check()


def run(messages: int, kill_after: int) -> dict[str, Any]:
    folder = Path(tempfile.mkdtemp(prefix="fsm-bench-rabbit-cluster-"))
    nodes = start_cluster(folder)
    try:
        url = failover(nodes)
        consumer, publisher = Consumer(url), Publisher(url, messages)
        consumer.start()
        t0 = time.monotonic()
        publisher.start()
        while len(publisher.confirmed) < kill_after:
            time.sleep(0.01)
        killed = leader(nodes)
        assert killed.process is not None
        os.killpg(killed.process.pid, signal.SIGKILL)
        killed_at = time.monotonic() - t0
        publisher.join(600)
        confirmed = set(publisher.confirmed)
        deadline = time.monotonic() + 120
        while not confirmed <= set(consumer.received) and time.monotonic() < deadline:
            time.sleep(0.1)
        consumer.stop.set()
        consumer.join(10)
        received = consumer.received
        return {
            "messages": messages,
            "killed": killed.name.split("-")[2],
            "killed_after_s": round(killed_at, 2),
            "seconds": round(time.monotonic() - t0, 2),
            "confirmed": len(confirmed),
            "received": len(received),
            "lost": len(confirmed - set(received)),
            "doubled": sum(1 for count in received.values() if count > 1),
            "publishes_failed_and_sent_again": publisher.sent_again,
            "consumer_reconnects": consumer.reconnects,
        }
    finally:
        for node in nodes:
            node.stop()
        shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--kill-after", type=int, default=5_000)
    args = parser.parse_args()
    if not 0 < args.kill_after < args.messages:
        parser.error("--kill-after must be between 0 and --messages")
    result = run(args.messages, args.kill_after)
    print(json.dumps(result, indent=2))
    print(f"written {write_result('rabbit_cluster', result)}")


if __name__ == "__main__":
    main()
