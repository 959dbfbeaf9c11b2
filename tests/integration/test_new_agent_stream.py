"""An agent's first answer creates its ack stream, which the bridge finds by looking for new
streams every few seconds (acks/streams.py's upkeep). An idle bridge is woken by the stream's
keyspace notification (acks/wakeup.py), which names the stream: one it does not read yet is
found there and then, so a newly started agent's first answers are not left waiting for the
next look. Against the suite's real Redis; the next look is put off for good here, so that
only the wake-up can find the stream (without it, the first test reads nothing)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from fsm_celery.acks import streams
from fsm_celery.acks.dead import DeadLetters
from fsm_celery.acks.streams import StreamConsumer
from fsm_celery.core.messages import agent_ack_stream
from tests.support.services import Services

READS = 40  # an idle read waits at most half a second: twenty seconds of them


@pytest.fixture
def client(services: Services, monkeypatch: pytest.MonkeyPatch) -> Iterator[redis.Redis]:
    monkeypatch.setattr(streams, "MAINTAIN_SECONDS", 3600.0)  # the next look, an hour away
    found = redis.Redis.from_url(services.redis_url)
    yield found
    found.close()


def _idle_consumer(client: redis.Redis, prefix: str) -> StreamConsumer:
    """A bridge's consumer that has looked for streams (none yet) and is waiting, idle."""
    consumer = StreamConsumer(
        client, prefix, DeadLetters(client, prefix), shared=True, batch=10, max_bytes=1_048_576
    )
    consumer.open()
    stop = threading.Event()
    assert consumer.read(stop) == []  # looks for streams, subscribes to their notifications
    assert consumer.read(stop) == []  # waits, idle
    return consumer


def _read_until_found(consumer: StreamConsumer, stop: threading.Event) -> list[str]:
    for _ in range(READS):
        batch = consumer.read(stop)
        if batch:
            return [d.item.raw for d in batch]
    return []


def test_an_agents_first_answer_is_read_when_it_wakes_the_idle_bridge(
    client: redis.Redis,
) -> None:
    prefix = f"newagent-{uuid.uuid4().hex[:8]}:"
    stream = agent_ack_stream(str(uuid.uuid4()), prefix)
    consumer = _idle_consumer(client, prefix)
    stop = threading.Event()
    try:
        threading.Timer(0.2, lambda: client.xadd(stream, {"message": "a first answer"})).start()
        assert _read_until_found(consumer, stop) == ["a first answer"]
        assert stream in consumer.streams
    finally:
        consumer._wakeup.close()
        client.delete(stream)


def test_a_stream_that_is_no_agents_is_not_looked_for(client: redis.Redis) -> None:
    """The bridge's own dead letters, or a key under the prefix that names no agent, wake it
    but make it look for nothing."""
    prefix = f"newagent-{uuid.uuid4().hex[:8]}:"
    foreign = agent_ack_stream("not-an-agent", prefix)
    consumer = _idle_consumer(client, prefix)
    stop = threading.Event()
    try:
        threading.Timer(0.2, lambda: client.xadd(foreign, {"message": "x"})).start()
        looked = consumer._next_upkeep
        for _ in range(3):
            assert consumer.read(stop) == []
            assert consumer._next_upkeep == looked  # no look was asked for
    finally:
        consumer._wakeup.close()
        client.delete(foreign)
