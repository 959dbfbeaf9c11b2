"""The dead-letter stream: where the messages given up on are parked, by the policy every way
acks are applied follows (fsm_celery.core.parking: the bridge's loop and the fsm.apply_acks
task both ask it when a message is given up on, and park it the same way). Parked messages are
kept, with their source and the reason (`fsm-celery rejected --parked`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import redis

from fsm_celery.acks.consumer import Envelope
from fsm_celery.core.parking import reason
from fsm_celery.metrics.instruments import count

DEAD_STREAM = "stream:state:dead"
DEAD_MAXLEN = 10_000


class DeadLetters:
    """The stream where given-up messages are parked, with their source and the reason."""

    def __init__(self, client: redis.Redis, prefix: str) -> None:
        self.client = client
        self.stream = prefix + DEAD_STREAM

    def park(self, pipe: Any, envelopes: Sequence[Envelope], why: str | None = None) -> None:
        """Add the messages to the dead-letter stream (in the caller's pipeline), each with its
        source and the reason (the policy's, by its tries, when none is given)."""
        now = datetime.now(UTC).isoformat()
        for envelope in envelopes:
            fields = {
                "message": envelope.item.raw,
                "source": envelope.source,
                "reason": why or reason(envelope),
                "parkedAt": now,
            }
            pipe.xadd(self.stream, fields, maxlen=DEAD_MAXLEN, approximate=True)
        count("fsm_dead_letters_total", by=len(envelopes))

    def latest(self, limit: int) -> list[dict[str, str]]:
        """The most recently parked messages, newest first."""
        found: Any = self.client.xrevrange(self.stream, count=limit)
        return [
            {"id": _text(entry_id), **{_text(k): _text(v) for k, v in fields.items()}}
            for entry_id, fields in found
        ]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
