"""Waking the idle ack bridge without reading what woke it.

An idle bridge must learn at once that an agent added to its ack stream. XREAD BLOCK would
tell it, but answers with the new entry whole: an agent that writes a 200 MB entry would have
it read into the bridge. A keyspace notification names the key and the command, never the
entry: the bridge subscribes to those of its ack streams and, woken, reads through
read_acks.lua, which never lets an entry over the limit out of Redis.

Notifications need `notify-keyspace-events` to hold K (keyspace channels) and t (stream
commands). The bridge adds both when it may (CONFIG SET; a server-wide setting that costs
nothing while nobody subscribes). Where it may not (a managed Redis, a user without CONFIG),
it reads every POLL_SECONDS instead, and says so once.
"""

from __future__ import annotations

import logging
import time
from typing import Any

import redis

from fsm_celery.channel.acl import glob_escape
from fsm_celery.core.messages import ack_stream

log = logging.getLogger(__name__)

POLL_SECONDS = 0.05  # an idle bridge's reads when Redis sends no notifications
DRAIN = 1000  # notifications read after a wake-up; past them, the subscription starts afresh
FLAGS = "Kt"  # keyspace channels, stream commands


class Wakeup:
    """Waits, while the bridge is idle, for a write to one of its ack streams."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        db = client.connection_pool.connection_kwargs.get("db", 0)
        # The agents' streams and the shared one: `<prefix>stream:state:ack[:<agent>]`.
        self.channel_prefix = f"__keyspace@{db}__:"
        self.pattern = self.channel_prefix + glob_escape(ack_stream(prefix)) + "*"
        self._notified: set[str] = set()  # streams XADDed to since take_added (at most DRAIN)
        self._pubsub: Any = None
        self._connection: Any = None
        self._polling = False

    def wait(self, seconds: float) -> None:
        """Return once an ack stream may have grown, or after `seconds`. Right after
        subscribing it returns at once: what was added before then was never notified."""
        if self._polling:
            time.sleep(min(POLL_SECONDS, seconds))
            return
        if self._pubsub is None:
            self._subscribe()
            return
        try:
            if not self._added(seconds):
                return
            for _ in range(DRAIN):
                if not self._connection.can_read(0):
                    return
                self._note(self._connection.read_response(push_request=True))
        except (redis.ConnectionError, redis.TimeoutError) as exc:
            log.info("the ack streams' notifications were cut (%s); subscribing again", exc)
        # A busy spell left many waiting (reading them all would delay the next batch), or
        # the connection went: starting afresh is cheaper.
        self.close()

    def _added(self, seconds: float) -> bool:
        """Whether an XADD was notified within `seconds` (the bridge's own XDEL and XTRIM,
        notified too, wake nobody). Read off the connection: an idle bridge reads about one
        notification per ack, and PubSub.get_message costs more than the rest of its wait."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            if not self._connection.can_read(left):
                return False
            if self._note(self._connection.read_response(push_request=True)):
                return True
        return False

    def take_added(self) -> set[str]:
        """The streams an XADD was notified for since the last call (those of the last waits:
        a stream the bridge does not read yet is an agent's first message)."""
        notified, self._notified = self._notified, set()
        return notified

    def _note(self, reply: Any) -> bool:
        """Whether the notification ([pmessage, pattern, channel, command]) is an XADD; its
        stream noted."""
        if not (isinstance(reply, list) and len(reply) == 4 and reply[-1] == b"xadd"):
            return False
        if len(self._notified) < DRAIN:
            self._notified.add(_text(reply[2]).removeprefix(self.channel_prefix))
        return True

    def close(self) -> None:
        """Drop the subscription; the next wait subscribes again (and sets the flags)."""
        if self._pubsub is not None:
            self._pubsub.close()
        self._pubsub, self._polling = None, False

    def _subscribe(self) -> None:
        if not self._enable():
            self._polling = True
            return
        pubsub = self.client.pubsub()  # type: ignore[no-untyped-call]
        pubsub.psubscribe(self.pattern)
        self._pubsub, self._connection = pubsub, pubsub.connection

    def _enable(self) -> bool:
        """Whether Redis sends the notifications (after adding the flags they need)."""
        try:
            reply: Any = self.client.config_get("notify-keyspace-events")
            flags = _text(reply.get("notify-keyspace-events", b""))
            missing = missing_flags(flags)
            if missing:
                self.client.config_set("notify-keyspace-events", flags + missing)
                log.info("notify-keyspace-events: %r, to wake the idle bridge", flags + missing)
        except redis.ResponseError as exc:
            log.warning(
                "cannot turn on Redis keyspace notifications (%s): the idle bridge reads every "
                "%.0f ms instead; set notify-keyspace-events to include %s (redis.conf) to "
                "wake it at once",
                exc,
                POLL_SECONDS * 1000,
                FLAGS,
            )
            return False
        return True


def missing_flags(flags: str) -> str:
    """The flags of FLAGS that notify-keyspace-events `flags` lacks (A stands for t too)."""
    have = set(flags) | ({"t"} if "A" in flags else set())
    return "".join(flag for flag in FLAGS if flag not in have)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
