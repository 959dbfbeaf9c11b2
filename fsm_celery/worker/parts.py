"""What a worker's tasks run on: the group commits of fsm.apply_acks and fsm.enter_state
(worker/combine.py), the engine behind them and the dead-letter stream, built on first use:
after a prefork worker forked, once for all the pool's threads.

The composition root (fsm_celery.wiring) gives a Worker the way to build its engine and its
dead-letter stream, and hands it to this process's tasks (worker/tasks.py, `provide`); from
then on the tasks call nothing but these parts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Protocol
from uuid import UUID

from fsm_celery.acks.consumer import Envelope
from fsm_celery.acks.dead import DeadLetters
from fsm_celery.acks.settle import Settler
from fsm_celery.channel.transient import TRANSIENT
from fsm_celery.config import Settings
from fsm_celery.core import tool
from fsm_celery.core.parking import Policy
from fsm_celery.engine import MachineEngine
from fsm_celery.engine.inbox import Applier
from fsm_celery.engine.tools import Pending
from fsm_celery.worker.combine import Combiner
from fsm_celery.worker.enqueue import Enqueue

log = logging.getLogger(__name__)

ENTRIES_A_ROUND = 200  # the most states fsm.enter_state tasks enter in one transaction

Step = tuple[UUID, int]  # a machine and the attempt to enter


class Worker:
    """A Celery worker's parts (its tasks' and fsm.apply_acks's). The tasks call its two
    Combiners; the engine behind them is built on their first round."""

    def __init__(
        self,
        settings: Settings,
        build_engine: Callable[[], MachineEngine],
        build_dead_letters: Callable[[], DeadLetters],
        engine: MachineEngine | None = None,
    ) -> None:
        self.settings = settings
        self.enqueue = Enqueue(settings)
        self.policy = Policy(settings.dead_letter_after)
        self._build_engine, self._build_dead = build_engine, build_dead_letters
        self._given = engine
        self._building = threading.Lock()
        self.forget()

    def forget(self) -> None:
        """Drop what was built before a fork (its connections are the parent's, its locks
        perhaps held by a thread the fork left behind)."""
        self._engine: MachineEngine | None = self._given
        self._batches: Applier[Envelope] | None = None
        self._settler: Settler | None = None
        self._caller: Calls | None = None
        # fsm.apply_acks's: the batches of the tasks that run meanwhile in this process's
        # threads, applied in one transaction (see fsm_celery.worker.combine)
        lanes = self.settings.worker_rounds_at_once
        self.applier: Combiner[Envelope] = Combiner(
            self._apply, self.settings.ack_batch_size, lanes
        )
        # fsm.enter_state's: the steps of the tasks that run meanwhile, in one transaction
        self.entries: Combiner[Step] = Combiner(self._enter, ENTRIES_A_ROUND, lanes)

    @property
    def engine(self) -> MachineEngine:
        if self._engine is None:
            with self._building:
                if self._engine is None:
                    self._engine = self._build_engine()
        return self._engine

    def _apply(self, batch: list[Envelope]) -> list[Envelope]:
        """Apply a batch, handing on every state it decided on, and settle on their streams the
        messages it applied or recorded; those neither applied nor recorded."""
        if self._batches is None:
            inbox = self.engine.inbox
            self._batches = Applier(inbox.apply, inbox.reject, self.enqueue, TRANSIENT)
        failed = self._batches(batch)
        kept = {id(d) for d in failed}
        self.settler.settle([d for d in batch if id(d) not in kept])
        return failed

    def _enter(self, steps: list[Step]) -> list[Step]:
        """Enter the steps in one transaction, handing on what follows; all of them left to
        enter alone if it failed for a reason that may be one step's (a transient one fails
        them all)."""
        try:
            self.enqueue(self.engine.entry.enter_many(steps))
        except TRANSIENT:
            raise
        except Exception:
            if len(steps) == 1:
                raise
            log.warning("%d states entered together failed; each is entered alone", len(steps))
            return steps
        return []

    @property
    def caller(self) -> Calls:
        """The MCP client of fsm.call_tool (its servers' connections: this process's own)."""
        if self._caller is None:
            with self._building:
                if self._caller is None:
                    self._caller = _caller(self.settings)
        return self._caller

    @property
    def settler(self) -> Settler:
        """Settles and parks the stream entries of the acks this worker applied."""
        if self._settler is None:
            with self._building:
                if self._settler is None:
                    self._settler = Settler(self._build_dead())
        return self._settler


class Calls(Protocol):
    def call(self, pending: Pending, /) -> tool.Outcome | None: ...


class _NoMcp:
    """The caller of a worker installed without the `mcp` extra: every call fails, saying so."""

    def call(self, pending: Pending, /) -> tool.Outcome | None:
        return tool.failed("tool states need the mcp package: pip install 'fsm-celery[mcp]'")


def _caller(settings: Settings) -> Calls:
    try:
        from fsm_celery.worker.caller import Caller
    except ImportError:
        log.error("this worker has no `mcp` package: every tool state's call fails")
        return _NoMcp()
    return Caller(settings)
