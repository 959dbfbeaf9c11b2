"""Two corrections to kombu's Redis transport (5.7.0), applied before any broker connection.

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
"""

from __future__ import annotations

from collections.abc import Callable
from queue import Empty
from typing import Any

from kombu.transport import redis as kombu_redis

_MARK = "_fsm_closes_over_dead_brpop"
_CLIENT = "_fsm_client"


def apply() -> None:
    """Apply both corrections (once per process)."""
    _close_over_dead_brpop()
    _one_client_per_channel()


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
