"""The in-process tier: the engine against real PostgreSQL and Redis, in the test's own process.

No worker, bridge or agent process is spawned: a test calls the engine's use cases directly,
reads the state_tasks the engine sent from Redis as an agent would, and answers with acks built
from them. The clock is the test's, so timeouts and retry delays need no sleeping. What needs
real processes (crashes, restarts, Celery, Flower) is tests/integration's. The HTTP API's tests
here ask the real app in this process (FastAPI's TestClient) on a deployment of env_factory's
(tests/conftest.py) that starts no process.
"""

from __future__ import annotations

import itertools
import json
import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import cached_property
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
import redis

from fsm_celery import wiring
from fsm_celery.client import MachineInfo, TransitionRecord
from fsm_celery.config import Settings
from fsm_celery.core.loader import SHIPPED_DEFINITIONS, definition_files, load_all
from fsm_celery.core.messages import task_stream
from fsm_celery.engine import EnterNow, Entry, Inbound, Inbox, MachineEngine, Next
from fsm_celery.store import queries as q
from fsm_celery.store.db import upgrade
from tests.support import FIXTURE_DEFINITIONS
from tests.support.credentials import TEST_SECRET
from tests.support.databases import copy_database, create_template, drop_database
from tests.support.messages import Reply, ack_for
from tests.support.receiver import receiver  # noqa: F401 (a fixture)
from tests.support.services import Services, require_services

TEMPLATE = f"fsm_inprocess_template_{os.getpid()}"
# the people of the approval gates (tests/fixtures/definitions/test_gate.yaml)
APPROVERS = {
    "alice": {"groups": ["release"]},
    "bob": {"groups": ["release"]},
    "carol": {"groups": ["release", "ops"]},
    "dave": {"groups": ["ops"]},
}
_numbers = itertools.count()


class Clock:
    """The engine's clock, moved by the test."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@dataclass
class Agent:
    """An agent's view of Redis: the state_tasks on its stream, read in order."""

    redis: redis.Redis
    stream: str
    last: bytes = b"-"
    seen: list[dict[str, Any]] = field(default_factory=list)
    cancels: list[dict[str, Any]] = field(default_factory=list)  # the state_cancels, in order
    refusals: list[dict[str, Any]] = field(default_factory=list)  # the state_ack_refused, too

    def tasks(self) -> list[dict[str, Any]]:
        """The state_tasks sent since the last call (state_cancels go to `cancels`, refusals
        to `refusals`)."""
        start = self.last if self.last == b"-" else b"(" + self.last
        entries = self.redis.xrange(self.stream, min=start)
        if entries:
            self.last = entries[-1][0]
        found = []
        for _, fields in entries:
            message = json.loads(fields[b"message"])
            kept = {"state_cancel": self.cancels, "state_ack_refused": self.refusals}
            kept.get(message["type"], found).append(message)
        self.seen.extend(found)
        return found

    def task(self) -> dict[str, Any]:
        """The one state_task sent since the last call."""
        [one] = self.tasks()
        return one


@dataclass
class Fsm:
    """One test's deployment: an engine on its own database, its clock, and Redis."""

    engine: MachineEngine
    clock: Clock
    redis: redis.Redis
    settings: Settings

    # -- the engine's use cases, each returning Next -------------------------------------

    def start(self, machine_type: str, context: dict[str, Any] | None = None, **kw: Any) -> UUID:
        """Start a machine and enter its first state, as the client and its task do (and the
        first states of the children it starts, as their fsm.enter_state tasks do)."""
        [first] = self.engine.admin.start(machine_type, context, **kw).next
        started = self.engine.entry.enter(first.machine_id, first.attempt)
        while started:
            assert all(step.delay == 0 for step in started)
            started = [s for step in started for s in self.engine.entry.enter(*step[:2])]
        return first.machine_id

    def receive(self, *messages: str | dict[str, Any], agent: UUID | None = None) -> Next:
        """Apply agents' messages in one batch, inline (due states entered at once)."""
        raws = [m if isinstance(m, str) else json.dumps(m) for m in messages]
        return self.inline.apply([Inbound(raw, agent) for raw in raws])

    @cached_property
    def inline(self) -> Inbox:
        """The inline mode's inbox on the engine (whose own, the settings' celery mode, hands
        every decided state on): the bridge's, started with --inline."""
        return inline_inbox(self.engine)

    def enter_all(self, next_states: Next) -> None:
        """Do what the fsm.enter_state tasks would, once each step's delay has passed."""
        for step in next_states:
            self.engine.entry.enter(step.machine_id, step.attempt)

    def scan(self) -> Next:
        return self.engine.scan.run(500).next

    # -- reading -------------------------------------------------------------------------

    def agent(self, name: str) -> Agent:
        return Agent(self.redis, task_stream(name, self.settings.channel_prefix))

    def machine(self, machine_id: UUID) -> MachineInfo:
        with self.engine.db.connect() as conn:
            row = q.get_machine_txn(conn, machine_id)
        assert row is not None
        return MachineInfo.from_row(row)

    def history(self, machine_id: UUID) -> list[TransitionRecord]:
        with self.engine.db.connect() as conn:
            return [TransitionRecord.from_row(r) for r in q.history_txn(conn, machine_id)]

    def rejections(self, machine_id: UUID | None = None) -> list[str]:
        """The reasons of the rejected messages (of one machine), oldest first."""
        with self.engine.db.connect() as conn:
            rows = q.rejections_txn(conn, machine_id)
        return [r.reason for r in reversed(rows)]


def ack(task: dict[str, Any], **reply: Any) -> dict[str, Any]:
    return ack_for(task, Reply(**reply))


def inline_inbox(engine: MachineEngine) -> Inbox:
    """An inbox on the engine's runtime that enters the states due now (the inline mode)."""
    return Inbox(engine.runtime, Entry(engine.runtime, EnterNow()))


@pytest.fixture(scope="session")
def template(services: Services) -> Iterator[str]:
    require_services(services.pg_url, services.redis_url)
    create_template(services.pg_url, TEMPLATE)
    yield TEMPLATE
    drop_database(services.pg_url, TEMPLATE)


@pytest.fixture
def fsm(services: Services, template: str) -> Iterator[Fsm]:
    yield from _on_postgresql(services, template)


@pytest.fixture
def fsm_unprepared(services: Services, template: str) -> Iterator[Fsm]:
    """The engine on PostgreSQL with its statements sent whole (FSM_DATABASE_PREPARE=false, as
    behind PgBouncer's transaction pooling), not prepared."""
    yield from _on_postgresql(services, template, database_prepare=False)


def _on_postgresql(services: Services, template: str, **settings_given: Any) -> Iterator[Fsm]:
    tag = f"{os.getpid()}_{next(_numbers)}"
    url = copy_database(services.pg_url, template, f"fsm_inprocess_{tag}")
    settings = Settings(
        database_url=url,
        redis_url=services.redis_url,
        queue=f"fsm-inprocess-{tag}",
        channel_prefix=f"inprocess{tag}:{uuid.uuid4().hex[:6]}:",
        task_token_secret=TEST_SECRET,
        definitions_path=str(SHIPPED_DEFINITIONS),
        approvers=APPROVERS,
        **settings_given,
    )
    clock = Clock()
    engine = wiring.machine_engine(settings, clock=clock)
    for folder in (SHIPPED_DEFINITIONS, FIXTURE_DEFINITIONS):
        engine.catalog.load(load_all(definition_files(str(folder))))
    try:
        with serving(engine, clock, settings, services) as fsm:
            yield fsm
    finally:
        drop_database(services.pg_url, f"fsm_inprocess_{tag}")


@pytest.fixture
def fsm_sqlite(services: Services, tmp_path: Path) -> Iterator[Fsm]:
    """The engine on SQLite (the embedded demo's database), its triggers made by the same
    migrations."""
    prefix = f"sqlite{uuid.uuid4().hex[:8]}:"
    settings = Settings(
        database_url=f"sqlite:///{tmp_path / 'fsm.sqlite3'}",
        redis_url=services.redis_url,
        channel_prefix=prefix,
        task_token_secret=TEST_SECRET,
    )
    clock = Clock()
    engine = wiring.machine_engine(settings, clock=clock)
    upgrade(engine.db)
    engine.catalog.load(load_all(definition_files(str(FIXTURE_DEFINITIONS))))
    with serving(engine, clock, settings, services) as fsm:
        yield fsm


@contextmanager
def serving(
    engine: MachineEngine, clock: Clock, settings: Settings, services: Services
) -> Iterator[Fsm]:
    """The test's Fsm on the engine; afterwards its Redis keys are deleted and its database
    connections closed."""
    connection = redis.Redis.from_url(services.redis_url)
    try:
        yield Fsm(engine, clock, connection, settings)
    finally:
        keys = list(connection.scan_iter(f"{settings.channel_prefix}*"))
        if keys:
            connection.delete(*keys)
        connection.close()
        engine.db.dispose()
