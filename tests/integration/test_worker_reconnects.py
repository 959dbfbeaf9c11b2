"""A worker that reconnects to Redis keeps nothing of its old connection (the third correction
of fsm_celery/worker/kombu_patch.py), here on the suite's Redis with kombu's own transport and
event loop, reconnecting as Celery's consumer does after a lost connection."""

from __future__ import annotations

import gc
import weakref

from kombu import Connection
from kombu.asynchronous import Hub

from fsm_celery.worker import kombu_patch
from tests.support.services import Services

RECONNECTS = 5


def test_each_reconnect_replaces_the_transports_poll_and_frees_the_old_connection(
    services: Services,
) -> None:
    kombu_patch.apply()
    hub = Hub()
    transports = []
    try:
        for _ in range(RECONNECTS):  # Consumer.connect(): a new connection, registered
            connection = Connection(services.redis_url)
            connection.default_channel.client.ping()  # a channel with its pool, in use
            connection.transport.register_with_event_loop(connection.connection, hub)
            transports.append(weakref.ref(connection.transport))
            connection.collect()  # the connection lost: Celery collects it, resets the loop
            hub.reset()
        del connection
        gc.collect()
        assert len(hub.on_tick) == 1  # the last connection's poll, and no older one
        assert [ref for ref in transports[:-1] if ref() is not None] == []
    finally:
        hub.close()
