"""Applying agents' messages: a batch in one transaction; a message that breaks it is isolated."""

from __future__ import annotations

import logging
from collections.abc import Callable

import redis
import sqlalchemy.exc

from fsm_celery.core.transition import RejectReason
from fsm_celery.engine import MachineEngine, Step

log = logging.getLogger(__name__)

# Errors of the surroundings, not of a message: the batch is tried again once they pass.
TRANSIENT = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
    redis.ConnectionError,
    redis.TimeoutError,
)

Enter = Callable[[list[Step]], None]


class AckApplier:
    """Applies raw agent messages in batches and schedules the retries they decided.

    A batch that fails for a reason other than a transient one is split and applied message by
    message, so that one message the database refuses (say, a number its column cannot hold) is
    recorded as rejected instead of holding back, or taking down, the acks around it.
    """

    def __init__(self, engine: MachineEngine, enter: Enter) -> None:
        self.engine = engine
        self.enter = enter

    def __call__(self, payloads: list[str]) -> None:
        """Apply the batch; raises only transient errors (the caller keeps it and tries again)."""
        try:
            steps = self.engine.apply_messages(payloads)
        except TRANSIENT:
            raise
        except Exception as exc:
            if len(payloads) > 1:
                for payload in payloads:
                    self([payload])
                return
            log.exception("a message could not be applied; it is recorded as rejected")
            detail = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            self.engine.reject(payloads[0], RejectReason.UNPROCESSABLE, detail)
            return
        # Steps due now were entered in the transaction; the others wait out a retry delay.
        self.enter([step for step in steps if step.delay > 0])
