"""The composition root: every process builds its parts here, from its settings.

The CLI, the Celery worker, the ack bridge, the embedded demo and the tests all call these, so
a part is put together one way only. Nothing else imports across layers to build one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

from fsm_celery.batches import BatchApplier
from fsm_celery.channel import Dispatcher
from fsm_celery.channel.bridge import (
    AckBridge,
    Apply,
    DeadLetters,
    PubSubSource,
    Source,
    StreamSource,
)
from fsm_celery.channel.redis import RedisDispatcher, connect
from fsm_celery.client import Client
from fsm_celery.config import Settings
from fsm_celery.core.messages import ack_channel
from fsm_celery.engine import MachineEngine
from fsm_celery.engine.runtime import utcnow
from fsm_celery.store import db as database
from fsm_celery.worker.enqueue import Enqueue, Relay


def machine_engine(
    settings: Settings,
    *,
    pre_ping: bool = True,
    dispatcher: Dispatcher | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> MachineEngine:
    """The engine on the settings' database, dispatching to agents through Redis (or through
    the dispatcher given: the demo's in-memory bus), on the clock given (tests move theirs).

    Without pre_ping no connection is tested as it leaves the pool: for a process that retries
    its work on connection errors anyway (worker tasks, the bridge), where a database restart
    costs one failed try and a ping per transaction would cost every transaction a round trip.
    """
    if dispatcher is None:
        redis = connect(settings.redis_url)
        dispatcher = RedisDispatcher(redis, settings.channel_prefix, settings.task_streams)
    db = database.connect(settings.database_url, pre_ping=pre_ping)
    return MachineEngine(db, dispatcher, settings, clock)


def client(settings: Settings, engine: MachineEngine | None = None) -> Client:
    """The client: starts machines and enqueues their first states on the settings' queue."""
    dead = DeadLetters(connect(settings.redis_url), settings.channel_prefix)
    return Client(engine or machine_engine(settings), Enqueue(settings), dead.latest)


def ack_handler(settings: Settings, *, inline: bool, engine: MachineEngine | None = None) -> Apply:
    """What the bridge does with each batch it reads: apply it (inline), or relay it to an
    fsm.apply_acks task (the celery mode)."""
    if inline:
        engine = engine or machine_engine(settings, pre_ping=False)
        return BatchApplier(engine, Enqueue(settings))
    return Relay(settings)


def ack_bridge(settings: Settings, *, inline: bool, pubsub: bool) -> AckBridge:
    """An ack bridge: the ack streams (and, with pubsub, the shared channel) read into the
    mode's handler."""
    apply = ack_handler(settings, inline=inline)
    linger = 0.0 if inline else settings.relay_linger_ms / 1000
    prefix, size, limit = (
        settings.channel_prefix,
        settings.ack_batch_size,
        settings.max_payload_bytes,
    )
    dead = DeadLetters(connect(settings.redis_url), prefix)
    sources: list[Source] = [
        StreamSource(
            connect(settings.redis_url),
            prefix,
            apply,
            dead,
            shared=settings.accept_shared_acks,
            batch=size,
            max_bytes=limit,
            claim_idle_ms=int(settings.stream_claim_idle_seconds * 1000),
            dead_letter_after=settings.dead_letter_after,
            maxlen=settings.ack_stream_maxlen,
            linger=linger,
        )
    ]
    if pubsub and settings.accept_shared_acks:
        channel = ack_channel(prefix)
        client = connect(settings.redis_url)
        sources.append(PubSubSource(client, channel, apply, dead, size, limit, linger))
    return AckBridge(sources)
