"""What every use case of the engine works with: the database, the way to agents, the
settings, the clock, and the machine definitions."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import sqlalchemy.exc
from sqlalchemy import Connection, Engine

from fsm_celery.config import Settings
from fsm_celery.core.clock import utcnow
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.fanout_validator import tree_problems
from fsm_celery.core.steps import Next
from fsm_celery.core.transition import Limits
from fsm_celery.engine.ports import Caller, Dispatcher, Observer
from fsm_celery.exceptions import DefinitionError, UnknownMachineType
from fsm_celery.store import queries as q
from fsm_celery.store import reads
from fsm_celery.store import schedules as schedule_store
from fsm_celery.store import slots as slot_store

# Errors of the surroundings (the database away), not of a message or a row: what failed with
# one is tried again once it passes. The dispatcher's own (Redis away) are given to the Runtime
# by whoever builds it (fsm_celery.wiring), with these in Runtime.transient.
DATABASE_AWAY = (
    sqlalchemy.exc.OperationalError,
    sqlalchemy.exc.InterfaceError,
)

log = logging.getLogger(__name__)

if TYPE_CHECKING:
    from fsm_celery.store.writes import Writes


class Catalog:
    """The machine definitions: stored as versions (a running machine keeps the version it
    started with), each parsed once per process."""

    def __init__(self, db: Engine, clock: Callable[[], datetime], max_depth: int = 5) -> None:
        self._db = db
        self._clock = clock
        self._max_depth = max_depth
        # each (type, version) parsed so far: what the hot path reads before it asks `version`
        self.parsed: dict[tuple[str, int], MachineDefinition] = {}

    def load(self, definitions: Iterable[MachineDefinition]) -> list[tuple[str, int, bool]]:
        """Store each definition as a new version when it changed, and make its schedules the
        stored ones: (type, version, created)."""
        definitions = list(definitions)
        loaded = []
        with self._db.begin() as conn:
            self._check_tree(conn, definitions)
            for definition in definitions:
                loaded.append((definition.type, *q.save_definition_txn(conn, definition)))
                schedule_store.sync_schedules_txn(conn, definition, self._clock())
                limits = {t: a.max_in_flight for t, a in definition.agent_types.items()}
                slot_store.set_limits_txn(conn, limits)  # the newest load's bounds hold
        return loaded

    def _check_tree(self, conn: Connection, definitions: list[MachineDefinition]) -> None:
        """Refuse definitions that start machines not loaded, start each other in a cycle, or
        nest children too deep, with those stored (DefinitionError, nothing stored)."""
        known = {t: d for t in reads.machine_types_txn(conn) if (d := self._latest(conn, t))}
        known |= {d.type: d for d in definitions}
        names = {d.type for d in definitions}
        problems = [p for p in tree_problems(known, self._max_depth) if p.source in names]
        if problems:
            raise DefinitionError(problems)

    def _latest(self, conn: Connection, machine_type: str) -> MachineDefinition | None:
        latest = q.latest_definition_txn(conn, machine_type)
        return latest[1] if latest is not None else None

    def version(self, conn: Connection, machine_type: str, version: int) -> MachineDefinition:
        """One version of a machine type (a child's inline type, `type.state[.branch]`, is
        part of its root type's version)."""
        key = (machine_type, version)
        found = self.parsed.get(key)
        if found is None:
            if "." in machine_type:
                root = self.version(conn, machine_type.split(".", 1)[0], version)
                found = self.parsed[key] = root.at(machine_type)
            else:
                found = self.parsed[key] = q.definition_txn(conn, machine_type, version)
        return found

    def latest(self, conn: Connection, machine_type: str) -> tuple[int, MachineDefinition]:
        """The newest version of a machine type (UnknownMachineType when none is loaded)."""
        latest = q.latest_definition_txn(conn, machine_type)
        if latest is None:
            raise UnknownMachineType(machine_type, reads.machine_types_txn(conn))
        self.parsed.setdefault((machine_type, latest[0]), latest[1])
        return latest


@dataclass
class Runtime:
    db: Engine  # SQLAlchemy's; "engine" in this package means the machine engine
    dispatcher: Dispatcher
    settings: Settings
    clock: Callable[[], datetime] = utcnow
    away: tuple[type[Exception], ...] = ()  # the dispatcher's errors when its transport is away
    caller: Caller | None = None  # makes tool states' calls (None: this process enters none)
    observer: Observer | None = None  # told what each transaction did (fsm_celery.metrics)
    catalog: Catalog = field(init=False)
    limits: Limits = field(init=False)
    transient: tuple[type[Exception], ...] = field(init=False)  # tried again once they pass

    def __post_init__(self) -> None:
        self.transient = (*DATABASE_AWAY, *self.away)
        self.catalog = Catalog(self.db, self.clock, self.settings.max_child_depth)
        self.limits = Limits(
            self.settings.max_context_bytes,
            self.settings.max_handbacks,
            self.settings.max_corrections,
        )

    @contextmanager
    def transaction(self, writes: Writes) -> Iterator[Connection]:
        """A transaction of a use case; once it commits, the transitions it wrote are announced,
        the attempts it superseded cancelled and the answers it refused sent back (never
        before: a listener must not see a move that was rolled back, nor an agent drop work
        that still counts)."""
        with self.db.begin() as conn:
            yield conn
        out = writes.out
        if out.sent is not None:
            out.sent.forget(out.sending)  # recorded as sent: nothing decides them again
        to_agents = out.cancels + out.refusals  # both go where the agent reads its tasks
        if to_agents:  # the transport is asked only when there is something to send
            self.dispatcher.cancel_many(to_agents)
        if out.events:
            self.dispatcher.announce(out.events)
        if out.calls:
            self._call(out.calls)
        if self.observer is not None:
            self.observer.committed(writes)

    def _call(self, calls: Next) -> None:
        """Have the tool states' calls made; committed all the same when that fails: those
        attempts time out and are retried."""
        try:
            if self.caller is None:
                raise RuntimeError("this process was built without a way to make tool calls")
            self.caller(calls)
        except Exception as exc:
            log.warning(
                "%d tool calls could not be sent (%s: %s): their attempts time out and are retried",
                len(calls),
                type(exc).__name__,
                exc,
            )
