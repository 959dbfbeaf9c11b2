"""What the acks side reads from: a Consumer hands out Envelopes and finishes them.

An Envelope is one agent message as read, with where it came from (its source, the label it
is parked under) and how many times it was handed out (its tries, the transport's own count:
a stream entry's deliveries, a Celery task's retries). The bridge's loop (acks/bridge.py)
reads a batch, has it handled, and tells the consumer what became of each message:

- `finish`: applied, or recorded as rejected; the consumer forgets it (XACK and XDEL);
- `hand_on`: relayed to a worker, which settles it once applied (the celery mode): a stream
  entry stays pending until then, and is relayed again if it is not settled in time;
- `retry`: neither; the consumer hands it out again, with one more try;
- `park`: given up on; the consumer puts it in the dead-letter stream, with the reason
  (acks/dead.py decides when), and forgets it.
"""

from __future__ import annotations

import threading
from typing import Any, NamedTuple, Protocol

from fsm_celery.engine.ports import Inbound


class Envelope(NamedTuple):
    """One message as a consumer read it."""

    item: Inbound
    source: str  # the stream or channel it was read from
    tries: int = 1  # times it was handed out, this one included
    key: Any = None  # the consumer's own handle on it (a stream entry's id)


class Consumer(Protocol):
    """A source of agents' messages: Redis streams (acks/streams.py), Redis pub/sub
    (acks/pubsub.py), or memory (acks/memory.py, for the demo and tests)."""

    name: str
    redelivers: bool  # whether a message can be handed out again (pub/sub's cannot)

    def open(self) -> None:
        """(Re)connect: called before the first read and after a lost connection."""

    def read(self, stop: threading.Event) -> list[Envelope]:
        """The next batch, waiting a moment for one; [] when nothing came."""
        ...

    def finish(self, envelopes: list[Envelope]) -> None:
        """These were applied or recorded: forget them."""

    def hand_on(self, envelopes: list[Envelope]) -> None:
        """These were relayed to workers: a consumer whose messages a worker can settle keeps
        them until it does (acks/settle.py); any other forgets them, as finished."""

    def retry(self, envelopes: list[Envelope]) -> None:
        """These could not be applied: hand them out again."""

    def park(self, envelopes: list[Envelope], why: str | None = None) -> None:
        """Put these in the dead-letter stream with the reason (the dead-letter policy's own
        when none is given), and forget them."""

    def close(self) -> None:
        """Forget what was read and not finished (it is handed out again to a consumer)."""
