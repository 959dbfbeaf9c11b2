"""When to give up on an agent's message and park it, and why (pure: the acks side parks what
this gives up, in the dead-letter stream, fsm_celery.acks.dead).

A message that can be neither applied nor recorded as rejected (the database refuses even
the rejection) is tried again, and parked once it was tried FSM_DEAD_LETTER_AFTER times; a
message that cannot be handed out again (pub/sub) is parked at once. A message handed out
more than CRASH_DELIVERIES times that never came back was in hand each time its reader died:
it is parked before it is tried again.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class Tried(Protocol):
    """A message as read: how many times it was handed out."""

    @property
    def tries(self) -> int: ...


T = TypeVar("T", bound=Tried)

CRASH_DELIVERIES = 10  # reads of a message never answered: it brought its reader down each time


class Policy:
    """When to give up on a message, and why (no I/O: the consumer parks what it gives up)."""

    CRASHED = f"read {CRASH_DELIVERIES} times and never answered"

    def __init__(self, after: int) -> None:
        self.after = after

    def give_up(self, failed: Sequence[T], *, redelivers: bool = True) -> list[T]:
        """Of the messages that could not be applied nor recorded, those to park now."""
        return [d for d in failed if not redelivers or d.tries >= self.after]

    def sort(self, failed: Sequence[T], *, redelivers: bool = True) -> tuple[list[T], list[T]]:
        """The failed messages as (to park now, to try again)."""
        parked = self.give_up(failed, redelivers=redelivers)
        given_up = {id(d) for d in parked}
        return parked, [d for d in failed if id(d) not in given_up]

    @staticmethod
    def crashed(batch: Sequence[T]) -> tuple[list[T], list[T]]:
        """The batch as (those handed out so often, never answered, that each must be what
        kills its reader; the others)."""
        crashed = [e for e in batch if e.tries > CRASH_DELIVERIES]
        return crashed, [e for e in batch if e.tries <= CRASH_DELIVERIES]


def reason(envelope: Tried) -> str:
    """Why a message given up on is parked (one text, whichever process parks it)."""
    times = "time" if envelope.tries == 1 else "times"
    return f"could not be applied nor recorded {envelope.tries} {times}"
