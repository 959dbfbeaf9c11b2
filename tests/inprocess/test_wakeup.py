"""The idle bridge's wake-up (finding 16): a keyspace notification that names the ack stream,
never the entry, against a real Redis; and the polling it falls back to where CONFIG is denied."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator

import pytest
import redis

from fsm_celery.acks.wakeup import Wakeup, missing_flags
from tests.support.services import Services


@pytest.fixture()
def client(services: Services) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(services.redis_url)
    yield client
    client.close()


LONG = 30.0  # a wait that is out only if nothing woke it


def _timed(wakeup: Wakeup, seconds: float, then: Callable[[], object] | None = None) -> float:
    if then is not None:
        threading.Timer(0.1, then).start()
    started = time.monotonic()
    wakeup.wait(seconds)
    return time.monotonic() - started


def test_an_xadd_to_an_ack_stream_wakes_the_idle_bridge_at_once(client: redis.Redis) -> None:
    prefix = f"wake-{uuid.uuid4().hex}:"
    stream = f"{prefix}stream:state:ack:{uuid.uuid4()}"
    wakeup = Wakeup(client, prefix)
    try:
        # Woken, it returns well before its wait is out (how soon is the machine's load's)
        assert _timed(wakeup, LONG) < LONG  # subscribing: returns at once, the caller reads again
        assert 0.09 < _timed(wakeup, LONG, lambda: client.xadd(stream, {"message": "{}"})) < LONG
        entry = client.xrange(stream)[0][0]
        assert _timed(wakeup, 0.4, lambda: client.xdel(stream, entry)) >= 0.39  # not an XADD
        other = f"{prefix}stream:agent:cto"  # a task stream is not an ack stream
        assert _timed(wakeup, 0.4, lambda: client.xadd(other, {"message": "{}"})) >= 0.39
        assert (
            missing_flags(client.config_get("notify-keyspace-events")["notify-keyspace-events"])
            == ""
        )
    finally:
        wakeup.close()
        client.delete(stream, f"{prefix}stream:agent:cto")


def test_without_config_rights_the_idle_bridge_polls(client: redis.Redis) -> None:
    user, password = f"no-config-{uuid.uuid4().hex}", uuid.uuid4().hex
    client.acl_setuser(
        user,
        enabled=True,
        passwords=[f"+{password}"],
        commands=["+@all", "-config"],
        keys=["*"],
        channels=["*"],
    )
    port = client.connection_pool.connection_kwargs["port"]
    limited = redis.Redis(port=port, username=user, password=password)
    wakeup = Wakeup(limited, "poll:")
    try:
        for _ in range(3):
            assert _timed(wakeup, LONG) < LONG  # back after a poll's sleep, not after LONG
    finally:
        wakeup.close()
        limited.close()
        client.acl_deluser(user)
