"""Applying agents' messages batch by batch: a batch in one transaction; a message that breaks
it is isolated, so that it cannot hold back or take down the messages around it.

One Applier serves both modes; the composition root (fsm_celery.wiring) gives it
`Inbox.apply` of an engine built for the mode: in the bridge, inline (the states due now
are entered in the batch's transaction), or in fsm.apply_acks, celery (nothing is sent,
every state decided is handed on). Inline, the operation keeps a Sent across tries: the
state_tasks a failed try sent before its write was refused are recorded by the split, or the
next try, without being sent again (DESIGN.md, invariant 8).
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fsm_celery.acks.consumer import Envelope
from fsm_celery.channel.transient import TRANSIENT
from fsm_celery.core.transition import RejectReason
from fsm_celery.engine.ports import Handoff, Inbound, Next

log = logging.getLogger(__name__)

Operation = Callable[[list[Inbound]], Next]  # apply a batch in one transaction
Reject = Callable[[str, RejectReason, str], None]  # record one message as rejected, alone


class Applier:
    """Applies raw agent messages (acks, hand-backs, heartbeats, statuses) in batches and hands
    on the states they decided and did not enter.

    A batch that fails for a reason other than a transient one is split and applied message by
    message, so that one message the database refuses is recorded as rejected instead of
    holding back, or taking down, the messages around it. A message that cannot even be
    recorded is returned to the caller, which tries it again and, past a few tries, parks it
    (acks/dead.py): nothing is dropped, and nothing stalls.
    """

    def __init__(self, operation: Operation, reject: Reject, handoff: Handoff) -> None:
        self.operation, self.reject, self.handoff = operation, reject, handoff

    def __call__(self, batch: list[Envelope]) -> list[Envelope]:
        """Apply the batch; the messages neither applied nor recorded. Raises only transient
        errors (the caller keeps the whole batch and tries again)."""
        try:
            next_states = self.operation([d.item for d in batch])
        except TRANSIENT:
            raise
        except Exception as exc:
            if len(batch) > 1:
                return [failed for envelope in batch for failed in self([envelope])]
            return self._reject(batch[0], exc)
        self._hand_on(len(batch), next_states)
        return []

    def _hand_on(self, applied: int, next_states: Next) -> None:
        """Hand the committed batch's states on. Redis or the broker away (a failover) loses
        nothing: each state's dispatch is due in PostgreSQL and the scan enters it. Trying the
        task again (or Celery's `reject requeue=False` when even that cannot be sent) would read
        as a batch lost, so the log says what happened instead."""
        try:
            self.handoff(next_states)
        except TRANSIENT as exc:
            log.warning(
                "applied and committed %d messages; the %d states they moved machines to could "
                "not be handed on (%s): nothing is lost, the scan enters each when it is due",
                applied,
                len(next_states),
                _first_line(exc),
            )

    def _reject(self, envelope: Envelope, error: Exception) -> list[Envelope]:
        log.error("a message could not be applied; it is recorded as rejected", exc_info=error)
        detail = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        try:
            self.reject(envelope.item.raw, RejectReason.UNPROCESSABLE, detail)
        except TRANSIENT:
            raise
        except Exception:
            log.exception("the rejection of a message could not be recorded either")
            return [envelope]
        return []


def _first_line(error: BaseException) -> str:
    text = str(error).splitlines()[0] if str(error) else ""
    return f"{type(error).__name__}: {text}"
