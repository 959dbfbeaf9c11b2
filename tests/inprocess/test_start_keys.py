"""Idempotent starts, on PostgreSQL and on the embedded SQLite store: a start repeated with its
key returns the machine the first one made and writes and enters nothing; a key reused for
another type, context or agent is refused with the reason and writes nothing; schedules and the
GitHub webhook key the machines they start."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from uuid import UUID

import pytest
from sqlalchemy import func, select

from fsm_celery.core.admin import Action, Command
from fsm_celery.core.github import Trigger
from fsm_celery.core.loader import parse_definition
from fsm_celery.exceptions import ContextMismatch, InvalidStartKey, StartKeyReused
from fsm_celery.records import MachineInfo
from fsm_celery.store.reader import Reader
from fsm_celery.store.start_keys import start_keys
from fsm_celery.store.tables import machines, transitions
from tests.inprocess.conftest import Fsm

T0 = datetime(2026, 3, 2, 12, 5, 0, tzinfo=UTC)


@pytest.fixture(params=["fsm", "fsm_sqlite"])
def any_db(request: pytest.FixtureRequest) -> Fsm:
    """The engine on PostgreSQL, then on SQLite."""
    found: Fsm = request.getfixturevalue(request.param)
    return found


def _count(fsm: Fsm, table: object, *where: object) -> int:
    with fsm.engine.db.connect() as conn:
        statement = select(func.count()).select_from(table).where(*where)  # type: ignore[arg-type]
        return int(conn.execute(statement).scalar_one())


def _written(fsm: Fsm) -> tuple[int, int, int]:
    """Machines, history rows and start keys, all told."""
    return _count(fsm, machines), _count(fsm, transitions), _count(fsm, start_keys)


def _info(fsm: Fsm, machine_id: UUID) -> MachineInfo:
    return MachineInfo.from_row(*Reader(fsm.engine.db).machine(machine_id))


def test_a_start_repeated_with_its_key_returns_the_first_machine_and_enters_nothing(
    any_db: Fsm,
) -> None:
    first = any_db.engine.admin.start("test_linear", {"order": 42, "rate": 1}, key="order-42")
    written = _written(any_db)
    again = any_db.engine.admin.start("test_linear", {"rate": 1.0, "order": 42}, key="order-42")
    assert (again.machine_id, again.found, again.next) == (first.machine_id, True, [])
    assert not first.found and len(first.next) == 1
    assert _written(any_db) == written
    assert _count(any_db, transitions, transitions.c.machine_id == first.machine_id) == 1


def test_the_key_is_shown_with_its_machine(any_db: Fsm) -> None:
    keyed = any_db.engine.admin.start("test_linear", {}, key="shown")
    plain = any_db.engine.admin.start("test_linear", {})
    assert _info(any_db, keyed.machine_id).key == "shown"
    assert _info(any_db, plain.machine_id).key is None


def test_starts_without_a_key_each_start_a_machine(any_db: Fsm) -> None:
    one = any_db.engine.admin.start("test_linear", {})
    two = any_db.engine.admin.start("test_linear", {})
    assert one.machine_id != two.machine_id and not one.found and not two.found


def test_the_key_returns_its_machine_whatever_its_status(any_db: Fsm) -> None:
    first = any_db.engine.admin.start("test_linear", {}, key="ended")
    any_db.engine.admin.command(first.machine_id, Command(Action.CANCEL, "ops", "done with it"))
    assert any_db.machine(first.machine_id).status == "cancelled"
    again = any_db.engine.admin.start("test_linear", {}, key="ended")
    assert (again.machine_id, again.found) == (first.machine_id, True)
    assert any_db.machine(first.machine_id).status == "cancelled"


@pytest.mark.parametrize(
    ("machine_type", "context", "agent", "says"),
    [
        ("test_pair", {"order": 42}, None, "another type"),
        ("test_linear", {"order": 43}, None, "another context"),
        ("test_linear", {"order": 42}, uuid.uuid4(), "another agent"),
        ("test_pair", {}, None, "another type and another context"),
    ],
)
def test_a_key_reused_for_another_start_is_refused_with_the_reason_and_writes_nothing(
    any_db: Fsm, machine_type: str, context: dict[str, int], agent: UUID | None, says: str
) -> None:
    first = any_db.engine.admin.start("test_linear", {"order": 42}, key="order-42")
    written = _written(any_db)
    with pytest.raises(StartKeyReused) as refused:
        any_db.engine.admin.start(machine_type, context, agent, key="order-42")
    message = str(refused.value)
    assert f"start key 'order-42' holds machine {first.machine_id} (a test_linear)" in message
    assert f"started with {says}:" in message
    assert _written(any_db) == written


def test_a_bad_key_is_refused_before_anything_is_written(any_db: Fsm) -> None:
    written = _written(any_db)
    with pytest.raises(InvalidStartKey, match=r"start key 'a\\nb': holds '\\n'"):
        any_db.engine.admin.start("test_linear", {}, key="a\nb")
    assert _written(any_db) == written


def test_a_refused_start_leaves_its_key_free(any_db: Fsm) -> None:
    with pytest.raises(ContextMismatch):
        any_db.engine.admin.start("test_checked", {"ticket": 0}, key="ticket")
    assert _count(any_db, start_keys) == 0
    started = any_db.engine.admin.start("test_checked", {"ticket": 7}, key="ticket")
    assert not started.found and _info(any_db, started.machine_id).key == "ticket"


def _scheduled(fsm: Fsm) -> None:
    fsm.engine.catalog.load(
        [
            parse_definition(
                {
                    "type": "sched_keyed",
                    "agent_type": "tester",
                    "initial_state": "WORK",
                    "schedules": [
                        {"name": "nightly", "cron": "0 * * * *", "context": {"region": "eu"}}
                    ],
                    "states": [
                        {"name": "WORK", "on_success": "DONE", "on_failure": "DONE"},
                        {"name": "DONE", "terminal": "completed"},
                    ],
                }
            )
        ]
    )


def test_a_schedule_tick_keys_its_machine_and_a_start_with_that_key_finds_it(
    any_db: Fsm,
) -> None:
    any_db.clock.now = T0
    _scheduled(any_db)
    any_db.clock.now = T0.replace(hour=13, minute=0, second=30)
    _, next_states = any_db.engine.schedules.run()
    [step] = next_states
    key = "schedule:sched_keyed/nightly:2026-03-02T13:00:00+00:00"
    assert _info(any_db, step.machine_id).key == key
    again = any_db.engine.admin.start("sched_keyed", {"region": "eu"}, key=key)
    assert (again.machine_id, again.found) == (step.machine_id, True)


def test_a_tick_whose_key_a_start_took_first_runs_that_machine(any_db: Fsm) -> None:
    any_db.clock.now = T0
    _scheduled(any_db)
    key = "schedule:sched_keyed/nightly:2026-03-02T13:00:00+00:00"
    early = any_db.engine.admin.start("sched_keyed", {"region": "eu"}, key=key)
    any_db.clock.now = T0.replace(hour=13, minute=0, second=30)
    _, next_states = any_db.engine.schedules.run()
    assert next_states == []  # that start entered it
    [run] = any_db.engine.schedules.history("sched_keyed/nightly")[0]
    assert (run.outcome, run.machine_id) == ("started", early.machine_id)
    assert _count(any_db, machines, machines.c.type == "sched_keyed") == 1


def test_a_trigger_keys_its_machine_by_when_it_ran(any_db: Fsm) -> None:
    any_db.clock.now = T0
    _scheduled(any_db)
    [step] = any_db.engine.schedules.trigger("sched_keyed/nightly", "ops")
    key = "schedule:sched_keyed/nightly:2026-03-02T12:05:00+00:00"
    assert _info(any_db, step.machine_id).key == key


def test_a_github_delivery_keys_the_machine_it_starts(any_db: Fsm) -> None:
    wanted = Trigger("test_linear", "acme/api", 726, {"githubIssue": 726})
    done = any_db.engine.github.deliver("72d3162e-cc78-11e3", "issues", wanted, "assigned")
    assert done.outcome == "started" and done.machine_id is not None
    assert _info(any_db, done.machine_id).key == "github:72d3162e-cc78-11e3"
    again = any_db.engine.github.deliver("72d3162e-cc78-11e3", "issues", wanted, "assigned")
    assert again.outcome == "duplicate"
    found = any_db.engine.admin.start(
        "test_linear", {"githubIssue": 726}, None, 726, key="github:72d3162e-cc78-11e3"
    )
    assert (found.machine_id, found.found) == (done.machine_id, True)


def test_a_key_lives_as_long_as_its_machine(any_db: Fsm) -> None:
    first = any_db.engine.admin.start("test_linear", {}, key="with-its-machine")
    with any_db.engine.db.begin() as conn:
        conn.execute(transitions.delete().where(transitions.c.machine_id == first.machine_id))
        conn.execute(machines.delete().where(machines.c.id == first.machine_id))
    assert _count(any_db, start_keys) == 0
    again = any_db.engine.admin.start("test_linear", {}, key="with-its-machine")
    assert not again.found and again.machine_id != first.machine_id
