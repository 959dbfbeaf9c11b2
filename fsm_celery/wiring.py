"""The composition root: every process builds its parts here, from its settings.

The CLI, the Celery worker (fsm_celery.celery), the ack bridge (fsm_celery.acks.serve), the
dashboard, the embedded demo and the tests call these, so a part is put together one way only,
and the transition mode is read here once, to pick the bridge's handler. Nothing else imports
across layers to build one.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import datetime
from functools import partial
from uuid import UUID

from redis import exceptions as redis_errors

from fsm_celery.acks import relay
from fsm_celery.acks.apply import TRANSIENT, Applier
from fsm_celery.acks.bridge import Bridge, Handler
from fsm_celery.acks.consumer import Consumer, Delivery
from fsm_celery.acks.dead import DeadLetters, Policy
from fsm_celery.acks.pubsub import PubSubConsumer
from fsm_celery.acks.streams import StreamConsumer
from fsm_celery.channel import acl, webhook
from fsm_celery.channel.redis import RedisDispatcher, connect
from fsm_celery.client import Client
from fsm_celery.config import Settings, TransitionMode
from fsm_celery.core.messages import ack_channel
from fsm_celery.engine import Dispatcher, EnterNow, HandOn, MachineEngine
from fsm_celery.engine.runtime import utcnow
from fsm_celery.engine.sent import Sent
from fsm_celery.store import db as database
from fsm_celery.worker import tasks
from fsm_celery.worker.app import app
from fsm_celery.worker.combine import Combiner
from fsm_celery.worker.tasks import Enqueue

log = logging.getLogger(__name__)

ENTRIES_A_ROUND = 200  # the most states fsm.enter_state tasks enter in one transaction


def machine_engine(
    settings: Settings,
    *,
    pre_ping: bool = True,
    dispatcher: Dispatcher | None = None,
    clock: Callable[[], datetime] = utcnow,
    mode: TransitionMode | None = None,
) -> MachineEngine:
    """The engine on the settings' database, dispatching to agents through Redis (or through
    the dispatcher given: the demo's in-memory bus), on the clock given (tests move theirs),
    in the transition mode given (the settings' by default): the one place it is decided
    whether the states agents' messages and entries lead to are entered here or handed on.

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
    inline = (mode or settings.transition_mode) is TransitionMode.INLINE
    onward = EnterNow() if inline else HandOn()
    away = (redis_errors.ConnectionError, redis_errors.TimeoutError)  # the dispatcher's
    return MachineEngine(db, dispatcher, settings, onward, webhook.post_all, clock, away)


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


def inline_applier(settings: Settings, engine: MachineEngine) -> Applier:
    """Applies each batch here, entering the states due now in its transaction (the inline
    mode's handler, and the demo's)."""
    operation = partial(engine.inbox.apply, sent=Sent())
    return Applier(operation, engine.inbox.reject, Enqueue(settings))


def ack_handler(settings: Settings, mode: TransitionMode) -> Handler:
    """What the bridge does with each batch it reads, by the mode: apply it (inline), or relay
    it to fsm.apply_acks tasks (celery)."""
    if mode is TransitionMode.INLINE:
        return inline_applier(settings, machine_engine(settings, pre_ping=False, mode=mode))
    route = None
    if settings.queues:  # each ack on its machine's queue: its type read once per machine
        db = database.connect(settings.database_url, prepare=settings.database_prepare)
        route = relay.Routes(db, settings.queue_for)
    inbox = machine_engine(settings, mode=mode).inbox  # agents' statuses: applied here, never tasks
    statuses = Applier(inbox.apply, inbox.reject, Enqueue(settings))
    return relay.Relay(app, settings.queue, settings.max_relay_bytes, route, statuses)


def ack_bridge(settings: Settings, mode: TransitionMode, *, pubsub: bool) -> Bridge:
    """An ack bridge: the ack streams (and, with pubsub, the shared channel) read into the
    mode's handler. In the celery mode a read lingers a moment, so a task carries a batch."""
    linger = 0.0 if mode is TransitionMode.INLINE else settings.relay_linger_ms / 1000
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
    return Bridge(consumers, ack_handler(settings, mode), Policy(settings.dead_letter_after))


class Worker:
    """A Celery worker's parts (its tasks' and fsm.apply_acks's), each built on first use: after
    a prefork worker forked, once for all the pool's threads."""

    def __init__(self, settings: Settings, engine: MachineEngine | None = None) -> None:
        self.settings = settings
        self.enqueue = Enqueue(settings)
        self.policy = Policy(settings.dead_letter_after)
        self._given = engine
        self._engine = engine
        self._applier: Combiner[Delivery] | None = None
        self._entries: Combiner[tuple[UUID, int]] | None = None
        self._dead: DeadLetters | None = None
        self._building = threading.Lock()

    @property
    def engine(self) -> MachineEngine:
        if self._engine is None:
            with self._building:
                if self._engine is None:
                    # Without a ping per transaction: a task that meets a connection a database
                    # restart broke fails with a transient error, the pool is discarded, and the
                    # task is retried.
                    self._engine = machine_engine(self.settings, pre_ping=False)
        return self._engine

    @property
    def applier(self) -> Combiner[Delivery]:
        """fsm.apply_acks's: applies a batch, handing every state it decided on; the batches
        of the tasks that run meanwhile in this process's threads in one transaction (one
        Combiner a process: see fsm_celery.worker.combine)."""
        if self._applier is None:
            inbox = self.engine.inbox
            with self._building:
                if self._applier is None:
                    applier = Applier(inbox.apply, inbox.reject, self.enqueue)
                    self._applier = Combiner(applier, self.settings.ack_batch_size)
        return self._applier

    @property
    def entries(self) -> Combiner[tuple[UUID, int]]:
        """fsm.enter_state's: enters states, handing on what follows; the steps of the tasks
        that run meanwhile in this process's threads in one transaction."""
        if self._entries is None:
            with self._building:
                if self._entries is None:
                    self._entries = Combiner(self._enter, ENTRIES_A_ROUND)
        return self._entries

    def _enter(self, steps: list[tuple[UUID, int]]) -> list[tuple[UUID, int]]:
        """Enter the steps in one transaction; all of them left to enter alone if it failed for
        a reason that may be one step's (a transient one fails them all)."""
        try:
            self.enqueue(self.engine.entry.enter_many(steps))
        except TRANSIENT:
            raise
        except Exception:
            if len(steps) == 1:
                raise
            log.warning("%d states entered together failed; each is entered alone", len(steps))
            return steps
        return []

    @property
    def dead_letters(self) -> DeadLetters:
        if self._dead is None:
            self._dead = dead_letters(self.settings)
        return self._dead

    def forget(self) -> None:
        """Drop what was built before a fork (its connections are the parent's)."""
        self._engine, self._applier, self._entries, self._dead = self._given, None, None, None


def provide_worker(settings: Settings, engine: MachineEngine | None = None) -> Worker:
    """Have this process's Celery tasks run on a Worker's parts."""
    worker = Worker(settings, engine)
    tasks.provide(worker)
    relay.provide(worker)
    return worker
