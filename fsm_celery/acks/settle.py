"""The celery mode's end of an ack: a worker settles the stream entries it applied.

The bridge relays each batch of acks to an fsm.apply_acks task and leaves their stream entries
pending (acks/relay.py); the worker that applied them, once its transaction committed, settles
them: XACK and XDEL, in one round trip for all those its round applied or recorded as rejected.
An entry nobody settles in time (its task lost by the broker, its worker killed) is relayed
again by a bridge (acks/streams.py), so an ack is never lost between the two.

A message given up on (acks/dead.py's policy) is parked here, acknowledged and deleted in the
same step, and only if it was still pending: a copy relayed again and given up on elsewhere too
is parked once (park_acks.lua). Messages that came from no stream (pub/sub, or a task sent
before entries travelled with it) have nothing to settle: they are parked as before.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path

import redis

from fsm_celery.acks.consumer import Envelope
from fsm_celery.acks.dead import DEAD_MAXLEN, DeadLetters
from fsm_celery.acks.streams import GROUP, acknowledge
from fsm_celery.core.parking import reason
from fsm_celery.metrics.instruments import count

log = logging.getLogger(__name__)

_PARK = (Path(__file__).parent / "park_acks.lua").read_text()


class Settler:
    """Settles and parks relayed stream entries on the agents' Redis."""

    def __init__(self, dead: DeadLetters) -> None:
        self.client, self.dead = dead.client, dead
        self._park = self.client.register_script(_PARK)

    def settle(self, envelopes: list[Envelope]) -> None:
        """Acknowledge and delete the entries these messages came from (applied or recorded;
        the transaction has committed). Redis away: they stay pending, are relayed again in
        time and refused as stale then; nothing waits for Redis here."""
        entries = [(d.source, d.key) for d in envelopes if d.key is not None]
        if not entries:
            return
        pipe = acknowledge(self.client.pipeline(transaction=False), entries)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning(
                "%d applied acks not settled on their streams (%s): relayed again "
                "later, then refused as stale",
                len(envelopes),
                exc,
            )

    def park(self, envelopes: list[Envelope], why: str | None = None) -> None:
        """Park these in the dead-letter stream: those from a stream once (if still pending),
        and acknowledged and deleted with it; the others as they are."""
        entries = [d for d in envelopes if d.key is not None]
        loose = [d for d in envelopes if d.key is None]
        if loose:
            pipe = self.client.pipeline(transaction=False)
            self.dead.park(pipe, loose, why)
            pipe.execute()
        if not entries:
            return
        keys = [self.dead.stream, *(d.source for d in entries)]
        args: list[str | int] = [GROUP, DEAD_MAXLEN, datetime.now(UTC).isoformat()]
        for d in entries:
            args += [d.key, d.item.raw, d.source, why or reason(d)]
        parked = self._park(keys=keys, args=args)
        count("fsm_dead_letters_total", by=int(parked))
        if parked:
            log.error("parked %d message(s) in %s", parked, self.dead.stream)
