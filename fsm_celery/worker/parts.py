"""What a worker's tasks run on: its engine, the group commits of fsm.apply_acks and
fsm.enter_state (worker/combine.py), the dead-letter stream; each built on first use, after a
prefork worker forked, once for all the pool's threads.

The composition root (fsm_celery.wiring) gives a Worker the way to build its engine and its
dead-letter stream, and `provide`s it to this process's tasks; from then on the tasks call
nothing but these parts.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from uuid import UUID

from fsm_celery.acks.apply import Applier
from fsm_celery.acks.consumer import Envelope
from fsm_celery.acks.dead import DeadLetters, Policy
from fsm_celery.channel.transient import TRANSIENT
from fsm_celery.config import Settings
from fsm_celery.engine import MachineEngine
from fsm_celery.worker.combine import Combiner
from fsm_celery.worker.enqueue import Enqueue

log = logging.getLogger(__name__)

ENTRIES_A_ROUND = 200  # the most states fsm.enter_state tasks enter in one transaction

Step = tuple[UUID, int]  # a machine and the attempt to enter


class Worker:
    """A Celery worker's parts (its tasks' and fsm.apply_acks's), each built on first use."""

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
        self._engine = engine
        self._applier: Combiner[Envelope] | None = None
        self._entries: Combiner[Step] | None = None
        self._dead: DeadLetters | None = None
        self._building = threading.Lock()

    @property
    def engine(self) -> MachineEngine:
        if self._engine is None:
            with self._building:
                if self._engine is None:
                    self._engine = self._build_engine()
        return self._engine

    @property
    def applier(self) -> Combiner[Envelope]:
        """fsm.apply_acks's: applies a batch, handing every state it decided on; the batches
        of the tasks that run meanwhile in this process's threads in one transaction (one
        Combiner a process: see fsm_celery.worker.combine)."""
        if self._applier is None:
            inbox = self.engine.inbox
            with self._building:
                if self._applier is None:
                    applier = Applier(inbox.apply_and_hand_on, inbox.reject, self.enqueue)
                    self._applier = Combiner(applier, self.settings.ack_batch_size)
        return self._applier

    @property
    def entries(self) -> Combiner[Step]:
        """fsm.enter_state's: enters states, handing on what follows; the steps of the tasks
        that run meanwhile in this process's threads in one transaction."""
        if self._entries is None:
            with self._building:
                if self._entries is None:
                    self._entries = Combiner(self._enter, ENTRIES_A_ROUND)
        return self._entries

    def _enter(self, steps: list[Step]) -> list[Step]:
        """Enter the steps in one transaction; all of them left to enter alone if it failed for
        a reason that may be one step's (a transient one fails them all)."""
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
    def dead_letters(self) -> DeadLetters:
        if self._dead is None:
            self._dead = self._build_dead()
        return self._dead

    def forget(self) -> None:
        """Drop what was built before a fork (its connections are the parent's)."""
        self._engine, self._applier, self._entries, self._dead = self._given, None, None, None


_worker: Worker | None = None


def provide(worker: Worker) -> None:
    """Run this process's tasks on these parts."""
    global _worker
    _worker = worker


def parts() -> Worker:
    """The parts this process's tasks run on."""
    if _worker is None:
        raise RuntimeError("fsm-celery's tasks run in a worker started with `celery -A fsm_celery`")
    return _worker
