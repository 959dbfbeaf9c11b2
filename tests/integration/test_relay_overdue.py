"""When the ack bridge relays again, in the celery mode, an entry no worker settled
(acks/overdue_acks.lua, through acks/streams.py's consumer), on the suite's real Redis: after
FSM_RELAY_TIMEOUT_SECONDS, then twice as long after each relay, never longer than ten minutes;
an entry settled meanwhile is not relayed. Each entry's idle time is set (XCLAIM IDLE) rather
than waited for, so nothing here depends on how fast the machine is."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator

import pytest
import redis

from fsm_celery.acks.dead import DeadLetters
from fsm_celery.acks.streams import GROUP, RELAY_CAP_MS, StreamConsumer
from fsm_celery.core.messages import agent_ack_stream
from tests.support.services import Services

TIMEOUT_MS = 1000


@pytest.fixture
def client(services: Services) -> Iterator[redis.Redis]:
    found = redis.Redis.from_url(services.redis_url)
    yield found
    found.close()


def _consumer(client: redis.Redis, prefix: str) -> StreamConsumer:
    consumer = StreamConsumer(
        client,
        prefix,
        DeadLetters(client, prefix),
        shared=False,
        batch=10,
        max_bytes=1_048_576,
        relay_after_ms=TIMEOUT_MS,
    )
    consumer.open()
    return consumer


def _overdue(consumer: StreamConsumer) -> list[tuple[str, int]]:
    """What one look for overdue entries takes (the look is otherwise every half timeout)."""
    consumer._next_claim = 0.0
    return [(d.item.raw, d.tries) for d in consumer._take_overdue()]


def _idle(client: redis.Redis, stream: str, entry: bytes | str, ms: int, deliveries: int) -> None:
    """The entry as if it had been relayed `deliveries` times, the last `ms` ago."""
    client.xclaim(stream, GROUP, "a-bridge", 0, [entry], idle=ms, retrycount=deliveries)


def _relayed(client: redis.Redis) -> tuple[StreamConsumer, str, bytes | str]:
    """An entry read by a bridge and handed on to a worker (left pending)."""
    prefix = f"overdue-{uuid.uuid4().hex[:8]}:"
    stream = agent_ack_stream(str(uuid.uuid4()), prefix)
    entry = client.xadd(stream, {"message": "an ack"})
    consumer = _consumer(client, prefix)
    batch = consumer.read(threading.Event())
    assert [(d.item.raw, d.tries) for d in batch] == [("an ack", 1)]
    consumer.hand_on(batch)
    consumer.close()  # nothing was finished: nothing is acknowledged
    assert client.xpending(stream, GROUP)["pending"] == 1
    return consumer, stream, entry


def test_an_entry_is_relayed_again_after_the_timeout_then_twice_as_long_each_time(
    client: redis.Redis,
) -> None:
    consumer, stream, entry = _relayed(client)
    _idle(client, stream, entry, TIMEOUT_MS - 100, 1)
    assert _overdue(consumer) == []
    _idle(client, stream, entry, TIMEOUT_MS + 100, 1)
    assert _overdue(consumer) == [("an ack", 2)]  # its second relay
    _idle(client, stream, entry, 2 * TIMEOUT_MS - 100, 2)
    assert _overdue(consumer) == []
    _idle(client, stream, entry, 2 * TIMEOUT_MS + 100, 2)
    assert _overdue(consumer) == [("an ack", 3)]
    _idle(client, stream, entry, 4 * TIMEOUT_MS + 100, 3)
    assert _overdue(consumer) == [("an ack", 4)]


def test_however_often_it_was_relayed_an_entry_waits_ten_minutes_at_most(
    client: redis.Redis,
) -> None:
    consumer, stream, entry = _relayed(client)
    assert RELAY_CAP_MS == 600_000
    _idle(client, stream, entry, RELAY_CAP_MS - 1000, 25)  # 2**24 timeouts, but for the cap
    assert _overdue(consumer) == []
    _idle(client, stream, entry, RELAY_CAP_MS + 1000, 25)
    assert _overdue(consumer) == [("an ack", 26)]


def test_an_entry_settled_meanwhile_is_not_relayed_again(client: redis.Redis) -> None:
    consumer, stream, entry = _relayed(client)
    client.xdel(stream, entry)  # a worker's XACK lost, its XDEL not: nothing left to relay
    _idle(client, stream, entry, TIMEOUT_MS + 100, 1)
    assert _overdue(consumer) == []
    assert client.xpending(stream, GROUP)["pending"] == 0
    client.xadd(stream, {"message": "another"})
    client.xack(stream, GROUP, entry)
    assert _overdue(consumer) == []  # a new entry is read, not taken over
