"""Celery's broker, whichever it is (fsm_celery/worker/broker.py, docs/scaling.md): on Redis plain
queues and countdowns as before; on RabbitMQ quorum queues with a delivery limit and a
dead-letter queue each, publisher confirms, and no countdown (the scan enters a due retry)."""

from __future__ import annotations

import uuid
from typing import Any

from celery.worker.consumer import consumer as celery_consumer

from fsm_celery.config import Settings
from fsm_celery.core.steps import Step
from fsm_celery.worker import events
from fsm_celery.worker.broker import (
    DEAD,
    DELIVERY_LIMIT,
    all_queues,
    broker_name,
    dead_letter_queue,
    task_queue,
)
from fsm_celery.worker.enqueue import Enqueue

REDIS = Settings(redis_url="redis://cache:6379/0")
RABBITMQ = Settings(redis_url="redis://cache:6379/0", broker_url="amqp://fsm:pw@rabbit:5672/fsm")


def test_on_redis_the_queues_are_plain_and_the_visibility_timeout_holds() -> None:
    for name in all_queues(REDIS):
        assert not task_queue(REDIS, name).queue_arguments
    assert REDIS.celery_transport_options == {"visibility_timeout": 60}
    assert broker_name(REDIS) == "Redis"


def test_on_rabbitmq_every_queue_is_a_quorum_queue_with_its_limit_and_dead_letters() -> None:
    assert all_queues(RABBITMQ) == ["fsm", "fsm.housekeeping"]
    for name in all_queues(RABBITMQ):
        queue = task_queue(RABBITMQ, name)
        assert queue.durable
        assert queue.queue_arguments == {
            "x-queue-type": "quorum",
            "x-delivery-limit": DELIVERY_LIMIT,
            "x-dead-letter-exchange": "",
            "x-dead-letter-routing-key": name + DEAD,
            "x-dead-letter-strategy": "at-least-once",
            "x-overflow": "reject-publish",
        }
        dead = dead_letter_queue(name)
        assert (dead.name, dead.queue_arguments) == (name + ".dead", {"x-queue-type": "quorum"})
    assert DELIVERY_LIMIT == 20
    assert RABBITMQ.celery_transport_options == {"confirm_publish": True}
    assert broker_name(RABBITMQ) == "RabbitMQ"


class Refusing:
    """A Celery app that fails the test if anything is sent through it."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the app was used: {name}")


def test_on_rabbitmq_a_delayed_step_is_not_sent_but_left_to_the_scan() -> None:
    delayed = Step(uuid.uuid4(), 2, delay=0.5, state="ONE", machine_type="test_linear")
    Enqueue(RABBITMQ, Refusing())([delayed])  # type: ignore[arg-type]
    assert Enqueue(REDIS, Refusing()).longest == 30.0  # type: ignore[arg-type]


def test_task_events_are_published_without_confirms() -> None:
    """The events' connection is read by the worker's loop: a confirm waited for on it by a
    pool thread could be read by the loop first (fsm_celery/worker/events.py)."""
    events.apply()
    made: dict[str, Any] = {}

    class App:
        def connection_for_write(self, **options: Any) -> str:
            made.update(options)
            return "connection"

    class Consumer:
        app = App()

        def ensure_connected(self, conn: str) -> str:
            return conn

    connect = celery_consumer.Consumer.connection_for_write
    assert connect(Consumer(), heartbeat=120) == "connection"  # type: ignore[arg-type]
    assert made["transport_options"] == {"confirm_publish": False}
