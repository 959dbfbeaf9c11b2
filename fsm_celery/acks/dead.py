"""The dead-letter policy, one for every way acks are applied: the bridge's loop and the
fsm.apply_acks task both ask it when a message is given up on, and park it the same way.

A message that can be neither applied nor recorded as rejected (the database refuses even
the rejection) is tried again, and parked once it was tried FSM_DEAD_LETTER_AFTER times; a
message that cannot be handed out again (pub/sub) is parked at once. A message handed out
more than CRASH_DELIVERIES times that never came back was in hand each time its reader died:
it is parked before it is tried again. Parked messages are kept, with their source and the
reason, in the dead-letter stream (`fsm-celery rejected --parked`).
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

import redis

from fsm_celery.acks.consumer import Envelope

DEAD_STREAM = "stream:state:dead"
DEAD_MAXLEN = 10_000
CRASH_DELIVERIES = 10  # reads of a message never answered: it brought its reader down each time


class Policy:
    """When to give up on a message, and why (no I/O: the consumer parks what it gives up)."""

    CRASHED = f"read {CRASH_DELIVERIES} times and never answered"

    def __init__(self, after: int) -> None:
        self.after = after

    def give_up(self, failed: Sequence[Envelope], *, redelivers: bool = True) -> list[Envelope]:
        """Of the messages that could not be applied nor recorded, those to park now."""
        return [d for d in failed if not redelivers or d.tries >= self.after]

    def sort(
        self, failed: Sequence[Envelope], *, redelivers: bool = True
    ) -> tuple[list[Envelope], list[Envelope]]:
        """The failed messages as (to park now, to try again)."""
        parked = self.give_up(failed, redelivers=redelivers)
        given_up = {id(d) for d in parked}
        return parked, [d for d in failed if id(d) not in given_up]

    @staticmethod
    def crashed(batch: Sequence[Envelope]) -> tuple[list[Envelope], list[Envelope]]:
        """The batch as (those handed out so often, never answered, that each must be what
        kills its reader; the others)."""
        crashed = [e for e in batch if e.tries > CRASH_DELIVERIES]
        return crashed, [e for e in batch if e.tries <= CRASH_DELIVERIES]


def reason(envelope: Envelope) -> str:
    """Why a message given up on is parked (one text, whichever process parks it)."""
    times = "time" if envelope.tries == 1 else "times"
    return f"could not be applied nor recorded {envelope.tries} {times}"


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

    def latest(self, limit: int) -> list[dict[str, str]]:
        """The most recently parked messages, newest first."""
        found: Any = self.client.xrevrange(self.stream, count=limit)
        return [
            {"id": _text(entry_id), **{_text(k): _text(v) for k, v in fields.items()}}
            for entry_id, fields in found
        ]


def _text(value: bytes | str) -> str:
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
