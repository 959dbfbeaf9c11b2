"""The live feed on a real Redis: the dashboard's hub is subscribed to the events channel only
while a page listens (Redis sends an unwatched dashboard nothing to read or parse), unsubscribes
a while after the last page leaves, and subscribes again for the next one on the connection it
kept: no reconnect between pages. A page's listener is handed over once the hub is subscribed,
so it misses nothing from then (and is not told to resync for it)."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
import redis

from fsm_celery.channel.redis import connect_async
from fsm_celery.http import hub as hub_module
from fsm_celery.http.hub import RESYNC, EventHub
from tests.support.services import Services


def test_the_hub_listens_only_while_pages_do(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    channel = f"hubtest:{uuid.uuid4().hex}:events"
    admin = redis.Redis.from_url(services.redis_url)
    connects = 0
    real = connect_async

    def counted(url: str) -> object:
        nonlocal connects
        connects += 1
        return real(url)

    def subscribers() -> int:
        return int(admin.pubsub_numsub(channel)[0][1])

    async def until(check: object, timeout: float = 5.0) -> None:
        deadline = asyncio.get_running_loop().time() + timeout
        while not check():  # type: ignore[operator]
            assert asyncio.get_running_loop().time() < deadline
            await asyncio.sleep(0.02)

    async def scenario() -> None:
        hub = EventHub(services.redis_url, channel, idle_seconds=0.3)
        hub.start()
        await asyncio.sleep(0.5)
        assert subscribers() == 0 and connects == 0  # nobody listens: not even connected
        event = json.dumps({"type": "state_event", "machineId": "m1", "toState": "B"})
        for _ in range(3):
            async with hub.listen() as page:  # once subscribed: nothing missed from then
                assert hub.subscribed and subscribers() == 1
                admin.publish(channel, event)
                assert await asyncio.wait_for(page.queue.get(), 2) == event
            await until(lambda: not hub.subscribed and subscribers() == 0)
            admin.publish(channel, event)  # nobody subscribed: never read
        assert connects == 1  # one connection for the three pages
        await hub.stop()

    monkeypatch.setattr(hub_module, "connect_async", counted)  # counts, connects for real
    try:
        asyncio.run(scenario())
    finally:
        admin.close()


def test_a_page_that_went_on_before_a_late_subscription_is_told_to_resync(
    services: Services, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A subscription slower than SUBSCRIBE_WAIT (here no wait at all) lets the page go on
    without it: what was published meanwhile never reaches it, so once subscribed the hub
    tells it to resync, and then carries what follows."""
    channel = f"hubtest:{uuid.uuid4().hex}:events"
    admin = redis.Redis.from_url(services.redis_url)
    event = json.dumps({"type": "state_event", "machineId": "m1", "toState": "B"})

    async def scenario() -> None:
        hub = EventHub(services.redis_url, channel, idle_seconds=0.3)
        hub.start()
        async with hub.listen() as page:
            assert not hub.subscribed  # it went on before the subscription
            assert await asyncio.wait_for(page.queue.get(), 5) == RESYNC
            admin.publish(channel, event)
            assert await asyncio.wait_for(page.queue.get(), 2) == event
        async with hub.listen() as page:  # subscribed already: nothing missed, no resync
            admin.publish(channel, event)
            assert await asyncio.wait_for(page.queue.get(), 2) == event
        await hub.stop()

    monkeypatch.setattr(hub_module, "SUBSCRIBE_WAIT", 0.0)
    try:
        asyncio.run(scenario())
    finally:
        admin.close()
