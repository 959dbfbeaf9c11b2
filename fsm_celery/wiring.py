"""The composition root: every process builds its parts here, from its settings.

The CLI, the Celery worker (fsm_celery.celery), the ack bridge (fsm_celery.acks.serve), the
dashboard, the embedded demo and the tests call these, so a part is put together one way only,
and the transition mode is read here once, to pick the bridge's handler. Nothing else imports
across layers to build one.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from functools import partial
from uuid import UUID

from fsm_celery.acks import relay
from fsm_celery.acks.bridge import Bridge, Handle, applied_here
from fsm_celery.acks.consumer import Consumer, Envelope
from fsm_celery.acks.dead import DeadLetters
from fsm_celery.acks.pubsub import PubSubConsumer
from fsm_celery.acks.streams import StreamConsumer
from fsm_celery.channel import acl, webhook
from fsm_celery.channel.redis import RedisDispatcher, connect
from fsm_celery.channel.transient import REDIS_AWAY, TRANSIENT
from fsm_celery.client import Client
from fsm_celery.config import Settings, TransitionMode
from fsm_celery.core.clock import utcnow
from fsm_celery.core.messages import ack_channel
from fsm_celery.core.parking import Policy
from fsm_celery.engine import Dispatcher, EnterNow, HandOn, MachineEngine
from fsm_celery.engine.inbox import Applier
from fsm_celery.metrics.observer import Counting
from fsm_celery.store import db as database
from fsm_celery.store.sent import Sent
from fsm_celery.worker import tasks
from fsm_celery.worker.app import app
from fsm_celery.worker.enqueue import Enqueue
from fsm_celery.worker.parts import Worker
from fsm_celery.worker.tools import CallTools


def machine_engine(
    settings: Settings,
    *,
    pre_ping: bool = True,
    dispatcher: Dispatcher | None = None,
    clock: Callable[[], datetime] = utcnow,
) -> MachineEngine:
    """The engine on the settings' database, dispatching to agents through Redis (or through
    the dispatcher given: the demo's in-memory bus), on the clock given (tests move theirs).
    The settings' transition mode is read here, the one place it is decided whether the states
    agents' messages and entries lead to are entered in this process or handed on.

    Without pre_ping no connection is tested as it leaves the pool: for a process that retries
    its work on connection errors anyway (worker tasks, the bridge), where a database restart
    costs one failed try and a ping per transaction would cost every transaction a round trip.
    """
    if dispatcher is None:
        redis = connect(settings.redis_url)
        dispatcher = RedisDispatcher(
            redis,
            settings.channel_prefix,
            settings.task_streams,
            settings.redis_replicas,
            settings.redis_replica_timeout_ms,
        )
    db = database.connect(
        settings.database_url, pre_ping=pre_ping, prepare=settings.database_prepare
    )
    inline = settings.transition_mode is TransitionMode.INLINE
    onward = EnterNow() if inline else HandOn()
    engine = MachineEngine(
        db, dispatcher, settings, onward, webhook.post_all, clock, REDIS_AWAY, CallTools(settings)
    )
    if settings.metrics_port:  # what its transactions did, counted (FSM_METRICS_PORT's /metrics)
        engine.runtime.observer = Counting(settings.transition_mode.value)
    return engine


def dead_letters(settings: Settings) -> DeadLetters:
    return DeadLetters(connect(settings.redis_url), settings.channel_prefix)


def client(settings: Settings, engine: MachineEngine | None = None) -> Client:
    """The client: starts machines and enqueues their first states on the settings' queue."""
    return Client(
        engine or machine_engine(settings),
        Enqueue(settings),
        dead_letters(settings).latest,
        partial(_revoke_agent_user, settings.redis_url),
    )


def _revoke_agent_user(redis_url: str, agent_id: UUID) -> bool:
    """channel.acl's revocation on a connection of its own (the client opens none otherwise)."""
    admin = connect(redis_url)
    try:
        return acl.revoke_agent_user(admin, agent_id)
    finally:
        admin.close()


def inline_applier(settings: Settings, engine: MachineEngine) -> Applier[Envelope]:
    """Applies each batch here, entering the states due now in its transaction (the inline
    mode's handler, and the demo's)."""
    operation = partial(engine.inbox.apply, sent=Sent())
    return Applier(operation, engine.inbox.reject, Enqueue(settings), TRANSIENT)


def handle_acks(settings: Settings) -> Handle:
    """What the bridge does with each batch it reads, by the settings' transition mode: apply
    it (inline), or relay it to fsm.apply_acks tasks (celery)."""
    if settings.transition_mode is TransitionMode.INLINE:
        return applied_here(inline_applier(settings, machine_engine(settings, pre_ping=False)))
    route = None
    if settings.queues:  # each ack on its machine's queue: its type read once per machine
        db = database.connect(settings.database_url, prepare=settings.database_prepare)
        route = relay.Routes(db, settings.queue_for)
    inbox = machine_engine(settings).inbox  # agents' statuses: applied here, never tasks
    statuses: Applier[Envelope] = Applier(inbox.apply, inbox.reject, Enqueue(settings), TRANSIENT)
    return relay.Relay(app, settings.queue, settings.max_relay_bytes, route, statuses)


def ack_bridge(settings: Settings, *, pubsub: bool) -> Bridge:
    """An ack bridge: the ack streams (and, with pubsub, the shared channel) read into the
    mode's handler. In the celery mode a read lingers a moment, so a task carries a batch."""
    inline = settings.transition_mode is TransitionMode.INLINE
    linger = 0.0 if inline else settings.relay_linger_ms / 1000
    dead = dead_letters(settings)
    consumers: list[Consumer] = [
        StreamConsumer(
            connect(settings.redis_url),
            settings.channel_prefix,
            dead,
            shared=settings.accept_shared_acks,
            batch=settings.ack_batch_size,
            max_bytes=settings.max_payload_bytes,
            claim_idle_ms=int(settings.stream_claim_idle_seconds * 1000),
            maxlen=settings.ack_stream_maxlen,
            linger=linger,
            relay_after_ms=None if inline else int(settings.relay_timeout_seconds * 1000),
        )
    ]
    if pubsub and settings.accept_shared_acks:
        consumers.append(
            PubSubConsumer(
                connect(settings.redis_url),
                ack_channel(settings.channel_prefix),
                dead,
                batch=settings.ack_batch_size,
                max_bytes=settings.max_payload_bytes,
                linger=linger,
            )
        )
    return Bridge(consumers, handle_acks(settings), Policy(settings.dead_letter_after))


def provide_worker(settings: Settings, engine: MachineEngine | None = None) -> Worker:
    """Have this process's Celery tasks run on a Worker's parts (on the engine given, else on
    one built on first use).

    Its engine pings no connection per transaction: a task that meets a connection a database
    restart broke fails with a transient error, the pool is discarded, and the task is retried.
    """
    worker = Worker(
        settings,
        partial(machine_engine, settings, pre_ping=False),
        partial(dead_letters, settings),
        engine,
    )
    tasks.provide(worker)
    return worker
