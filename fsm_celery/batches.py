"""Agents' messages batch by batch: a batch in one transaction; a message that breaks it is
isolated, so that it cannot hold back or take down the messages around it."""

from __future__ import annotations

import logging
from collections.abc import Callable

import kombu.exceptions

from fsm_celery.core.transition import RejectReason
from fsm_celery.engine import Inbound, MachineEngine, Next, runtime
from fsm_celery.engine.steps import Sent

log = logging.getLogger(__name__)

# Errors of the surroundings, not of a message: the batch is tried again once they pass.
TRANSIENT = (
    *runtime.TRANSIENT,
    kombu.exceptions.OperationalError,  # the broker, when a task could not be published
)

Enter = Callable[[Next], None]


class BatchApplier:
    """Applies raw agent messages (acks, hand-backs, heartbeats, statuses) in batches and hands
    on the states they decided.

    Inline, the states due now are entered in the batch's transaction; every other state
    decided (all of them in the celery mode) is handed to `enter`, an fsm.enter_state task each.
    A batch that fails for a reason other than a transient one is split and applied message by
    message, so that one message the database refuses is recorded as rejected instead of
    holding back, or taking down, the messages around it. A message that cannot even be
    recorded is handed back to the caller, which keeps it for another try and, past a few,
    parks it (the bridge's dead-letter stream): nothing is dropped, and nothing stalls.
    """

    def __init__(self, engine: MachineEngine, enter: Enter, *, inline: bool = True) -> None:
        self.engine = engine
        self.enter = enter
        self.inline = inline
        # The state_tasks a failed try sent before its write was refused: a split, or the
        # caller's next try, records them without sending them again (DESIGN.md, invariant 8).
        self.sent = Sent()

    def __call__(self, batch: list[Inbound]) -> list[Inbound]:
        """Apply the batch; the messages neither applied nor recorded. Raises only transient
        errors (the caller keeps the whole batch and tries again)."""
        try:
            next_states = self.engine.inbox.apply(batch, enter=self.inline, sent=self.sent)
        except TRANSIENT:
            raise
        except Exception as exc:
            if len(batch) > 1:
                return [failed for item in batch for failed in self([item])]
            return self._reject(batch[0], exc)
        self.enter(next_states)
        return []

    def _reject(self, item: Inbound, error: Exception) -> list[Inbound]:
        log.error("a message could not be applied; it is recorded as rejected", exc_info=error)
        detail = f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"
        try:
            self.engine.inbox.reject(item.raw, RejectReason.UNPROCESSABLE, detail)
        except TRANSIENT:
            raise
        except Exception:
            log.exception("the rejection of a message could not be recorded either")
            return [item]
        return []
