"""The seed's shared channel: SUBSCRIBE, and hand out what arrives, batch by batch.

A published message is gone once read: one that fails cannot be handed out again, so the
dead-letter policy parks it at once. Only read while FSM_ACCEPT_SHARED_ACKS allows it.
"""

from __future__ import annotations

import logging
import threading
import time

import redis

from fsm_celery.acks.consumer import Envelope
from fsm_celery.acks.dead import DeadLetters
from fsm_celery.acks.streams import clip
from fsm_celery.engine.ports import Inbound

log = logging.getLogger(__name__)


class PubSubConsumer:
    name = "pubsub"
    redelivers = False

    def __init__(
        self,
        client: redis.Redis,
        channel: str,
        dead: DeadLetters,
        *,
        batch: int,
        max_bytes: int,
        linger: float = 0.0,
    ) -> None:
        self.client, self.channel, self.dead = client, channel, dead
        self.batch, self.max_bytes, self.linger = batch, max_bytes, linger
        self._pubsub: redis.client.PubSub | None = None

    def open(self) -> None:
        self.close()
        self._pubsub = self.client.pubsub(ignore_subscribe_messages=True)  # type: ignore[no-untyped-call]
        self._pubsub.subscribe(self.channel)
        log.info("ack bridge subscribed to %s", self.channel)

    def read(self, stop: threading.Event) -> list[Envelope]:
        """The next message, waiting for it, and those received behind it within the linger."""
        assert self._pubsub is not None, "open() first"
        message = self._pubsub.get_message(timeout=0.5)
        if message is None:
            return []
        deadline = time.monotonic() + self.linger
        batch: list[Envelope] = []
        while True:
            if message is not None:
                item = Inbound(clip(message["data"], self.max_bytes))
                batch.append(Envelope(item, self.channel))
                if len(batch) >= self.batch:
                    return batch
            left = deadline - time.monotonic()
            message = self._pubsub.get_message(timeout=max(left, 0.0))
            if message is None and left <= 0:
                return batch

    def finish(self, envelopes: list[Envelope]) -> None:
        """Nothing to do: a published message is not kept."""

    def hand_on(self, envelopes: list[Envelope]) -> None:
        self.finish(envelopes)  # nothing a worker could settle: handed on is done with

    def retry(self, envelopes: list[Envelope]) -> None:
        """Never asked: a published message cannot be handed out again (redelivers)."""

    def park(self, envelopes: list[Envelope], why: str | None = None) -> None:
        if envelopes:
            pipe = self.client.pipeline(transaction=False)
            self.dead.park(pipe, envelopes, why)
            pipe.execute()
            log.error("parked %d message(s) in %s", len(envelopes), self.dead.stream)

    def close(self) -> None:
        if self._pubsub is not None:
            self._pubsub.close()
            self._pubsub = None
