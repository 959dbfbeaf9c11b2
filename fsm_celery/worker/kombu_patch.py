"""Three corrections to kombu's Redis transport (5.7.0), applied before any broker connection.

1. A Redis restart must not kill the worker: kombu's Redis channel closes over a dead BRPOP.

On a broker connection error Celery's consumer (5.7.0, `on_connection_error_after_connected`)
calls `Connection.collect()`, then `Connection.close()`. kombu's Redis `Channel.close()` first
reads the reply of the BRPOP pending on the channel and catches only `Empty` there; with Redis
gone that read raises a connection error, which `collect()` swallows, and the channel stays
half closed: not marked closed, its unacknowledged messages not restored. `collect()` then sets
`transport.client = None`, and `close()` closes that channel again. This time it gets as far as
restoring the unacknowledged messages (every task in flight is one, with late acks), which
needs a new connection pool built from `transport.client`:
`AttributeError: 'NoneType' object has no attribute 'hostname'` in `_connparams`. That is no
connection error, so the worker exits ("Unrecoverable error"). It takes a BRPOP pending and a
task in flight at the moment Redis goes away, hence only some restarts.

A dead connection has no reply left to read, so the channel goes on closing as if the reply
were empty, in the first close, while the transport still knows its broker. The restore then
works, or fails with a connection error, which Celery expects, and leaves the messages to the
visibility timeout. Remove this once kombu's `Channel.close()` catches connection errors
around that read (kombu 5.7.0 does not).

2. One Redis client per channel, not one per command. kombu builds a new `redis.Redis` for
every publish, every event and every acknowledgement (`Channel.conn_or_acquire`), and on
redis-py 8 building one costs more than the command it sends (its table of response callbacks
is rebuilt each time): 8% of a worker's CPU in the celery transition mode, measured with
py-spy. The client is a thin handle on the channel's connection pool, safe to share between
threads, so the channel keeps the one it built for as long as its pool lives.

3. A reconnect must not keep the old connection alive: one Redis poll on the worker's loop.

Each time Celery's consumer connects (at start, and after every lost broker connection: a
Sentinel failover, a Redis restart, a FLUSHALL's dropped clients), kombu's Redis transport adds a
callback to the event loop's `on_tick` set that polls its connection's channels. Celery resets
the loop after a lost connection (`hub.reset()`) but never empties `on_tick`, so every old
callback stays, polling nothing, and holding the old transport with its channels, their pools
and (behind Sentinel) a `redis.sentinel.Sentinel` of four clients each: the worker's memory grew
about 1.3 MiB a minute under the soak's faults (docs/reliability.md), flat without them. On
Redis only the consuming connection registers with the loop (Celery's events connection does so
for broker heartbeats, which Redis has not), so a registration replaces the previous one's
callbacks. Remove this once kombu drops its callback when the connection is collected.
"""

from __future__ import annotations

from collections.abc import Callable
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis

_MARK = "_fsm_closes_over_dead_brpop"
_CLIENT = "_fsm_client"
_TICKS = "_fsm_redis_ticks"


def apply() -> None:
    """Apply the three corrections (once per process)."""
    _close_over_dead_brpop()
    _one_client_per_channel()
    _one_poll_per_loop()


def _close_over_dead_brpop() -> None:
    """Let kombu's Redis channel close when the connection of its pending BRPOP is gone."""
    close: Callable[[Any], None] = kombu_redis.Channel.close
    if getattr(close, _MARK, False):
        return

    def close_over_dead_brpop(channel: Any) -> None:
        if channel._in_poll:
            channel._closing = True
            try:
                channel._brpop_read()  # it disconnects a dead connection and clears _in_poll
            except (Empty, *channel.connection_errors):
                pass
        close(channel)

    setattr(close_over_dead_brpop, _MARK, True)
    kombu_redis.Channel.close = close_over_dead_brpop  # type: ignore[method-assign]


def _one_client_per_channel() -> None:
    """Let kombu's Redis channel reuse its client for the commands it sends on its pool."""
    create: Callable[..., Any] = kombu_redis.Channel._create_client
    if getattr(create, _MARK, False):
        return

    def reused_client(channel: Any, asynchronous: bool = False) -> Any:
        if asynchronous:
            return create(channel, asynchronous=True)
        pool = channel.pool  # a new one after a disconnect: the client is then built anew
        client = channel.__dict__.get(_CLIENT)
        if client is None or client.connection_pool is not pool:
            client = channel.__dict__[_CLIENT] = create(channel)
        return client

    setattr(reused_client, _MARK, True)
    kombu_redis.Channel._create_client = reused_client  # type: ignore[method-assign]


def _one_poll_per_loop() -> None:
    """Let the Redis transport's registration with an event loop replace the callbacks the
    previous one added to the loop's `on_tick`, rather than add to them."""
    register: Callable[..., None] = kombu_redis.Transport.register_with_event_loop
    if getattr(register, _MARK, False):
        return

    def register_once(transport: Any, connection: Any, loop: Any) -> None:
        before = set(loop.on_tick)
        register(transport, connection, loop)
        added = set(loop.on_tick) - before
        for stale in loop.__dict__.get(_TICKS, set()) - added:
            loop.on_tick.discard(stale)
        loop.__dict__[_TICKS] = added

    setattr(register_once, _MARK, True)
    kombu_redis.Transport.register_with_event_loop = register_once  # type: ignore[method-assign]
