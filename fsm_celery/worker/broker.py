"""Celery's broker, whichever it is: the queues the fsm tasks go on, and how many wait in each.

On Redis a queue is a list under the queue's name (kombu's priority steps beside it). On
RabbitMQ (FSM_BROKER_URL amqp://) each is a quorum queue: durable and replicated over the
cluster's nodes (a majority holds a task before the publisher's confirm says it is sent), with
a delivery limit and a dead-letter queue beside it, `QUEUE.dead`, that no worker consumes.

Retry delays on RabbitMQ: Celery 5.7 delays a task on quorum queues by routing it through its
native delayed delivery exchanges, which route by topic and skip a queue bound to a direct
exchange (ours: the nameless one, as on Redis); such a countdown would be held in a worker's
memory instead. So on RabbitMQ an fsm.enter_state is never sent with a countdown: a state whose
retry is due is entered by the scan (worker/enqueue.py), as on Redis a delay longer than half
the visibility timeout is.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

import kombu.connection
import kombu.entity
from celery import bootsteps

from fsm_celery.config import Settings

# kombu's classes, untyped
Connection: Any = kombu.connection.Connection
Exchange: Any = kombu.entity.Exchange
Queue: Any = kombu.entity.Queue
NOT_FOUND = 404  # AMQP's reply code to a passive declare of a queue that is not there

# How often RabbitMQ hands a task out before it dead-letters it. A killed worker gives back
# every task it held (late acks: up to its prefetch, 32), each delivery counted; an fsm task
# runs for milliseconds, so one that came back twenty times without being acknowledged crashed
# its workers twenty times over (a poisoned message, which would otherwise kill each new
# worker in turn), not work that met a SIGKILL or two. What it held is not lost with it: its
# machine's state is in PostgreSQL, and the scan enters it again; the message waits in
# QUEUE.dead for someone to read.
DELIVERY_LIMIT = 20
DEAD = ".dead"
KOMBU_PRIORITY_SEP = "\x06\x16"  # kombu's Redis transport: a queue's key for priority n
PRIORITIES = ("", "3", "6", "9")  # kombu's default priority steps (0 is the bare name)
DIRECT = Exchange("", type="direct")  # the nameless exchange: it routes by queue name alone


def task_queue(settings: Settings, name: str) -> Any:
    """A queue of the fsm tasks: on RabbitMQ a quorum queue with its limit and dead letters."""
    if not settings.broker_is_amqp:
        return Queue(name, DIRECT, routing_key=name)
    arguments = {
        "x-queue-type": "quorum",
        "x-delivery-limit": DELIVERY_LIMIT,
        "x-dead-letter-exchange": "",
        "x-dead-letter-routing-key": name + DEAD,
        # kept by the queue until its dead-letter queue has it (RabbitMQ 3.10+), which asks
        # that a full queue refuse publishes rather than drop its oldest (none is bounded)
        "x-dead-letter-strategy": "at-least-once",
        "x-overflow": "reject-publish",
    }
    return Queue(name, DIRECT, routing_key=name, durable=True, queue_arguments=arguments)


def dead_letter_queue(name: str) -> Any:
    """Where RabbitMQ puts the queue's tasks past their delivery limit (nobody consumes it)."""
    dead = name + DEAD
    return Queue(dead, DIRECT, routing_key=dead, durable=True, queue_arguments=_QUORUM)


_QUORUM = {"x-queue-type": "quorum"}


def all_queues(settings: Settings) -> list[str]:
    """The queues of the fsm tasks: the machines' work, then housekeeping."""
    return [*settings.work_queues, settings.housekeeping_queue]


class DeadLetters(bootsteps.StartStopStep):  # type: ignore[misc]
    """A worker's step on RabbitMQ: its queues' dead-letter queues declared on each connection
    (a queue's dead letters need somewhere to go before the first one does)."""

    requires = ("celery.worker.consumer.tasks:Tasks",)

    def start(self, c: Any) -> None:
        channel = c.connection.default_channel
        for queue in c.app.amqp.queues.values():
            if (queue.queue_arguments or {}).get("x-dead-letter-routing-key"):
                dead_letter_queue(queue.name)(channel).declare()


class QueueLengths(Protocol):
    """How many tasks wait in each named Celery queue (0 for one not there yet)."""

    def __call__(self, names: Sequence[str]) -> dict[str, int]: ...


class RedisQueues:
    """On Redis: each queue's list, its priority steps added."""

    def __init__(self, client: Any) -> None:
        self.client = client

    def __call__(self, names: Sequence[str]) -> dict[str, int]:
        pipe = self.client.pipeline(transaction=False)
        for name in names:
            for step in PRIORITIES:
                pipe.llen(name + (KOMBU_PRIORITY_SEP + step if step else ""))
        lengths = pipe.execute()
        per = len(PRIORITIES)
        return {n: int(sum(lengths[i * per : (i + 1) * per])) for i, n in enumerate(names)}


class AmqpQueues:
    """On RabbitMQ: each queue's ready messages, asked by a passive declare (which creates
    nothing); a connection for each reading."""

    def __init__(self, url: str, timeout: float = 3.0) -> None:
        self.url, self.timeout = url, timeout

    def __call__(self, names: Sequence[str]) -> dict[str, int]:
        found: dict[str, int] = {}
        with Connection(self.url, connect_timeout=self.timeout) as conn:
            for name in names:
                channel = conn.channel()  # a queue not there closes its channel
                try:
                    found[name] = int(channel.queue_declare(name, passive=True).message_count)
                except conn.channel_errors as exc:
                    if getattr(exc, "reply_code", None) != NOT_FOUND:
                        raise
                    found[name] = 0
                else:
                    channel.close()
        return found


def queue_lengths(settings: Settings, connect: Any) -> QueueLengths:
    """The reader of the deployment's Celery queues: RabbitMQ's, or Redis's (`connect` makes
    the Redis client of a URL)."""
    if settings.broker_is_amqp:
        return AmqpQueues(settings.celery_broker_url)
    # as FSM_* names it (redis+sentinel:// too, which connect follows), not as kombu spells it
    return RedisQueues(connect(settings.broker_url or settings.redis_url))


def broker_name(settings: Settings) -> str:
    """What kind of broker Celery's is: RabbitMQ, Redis or memory."""
    url = settings.celery_broker_url
    if settings.broker_is_amqp:
        return "RabbitMQ"
    return "memory" if url.startswith("memory://") else "Redis"
