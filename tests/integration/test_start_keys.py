"""Idempotent starts against the real deployment: eight clients racing with one key make one
machine, entered once; a start repeated after PostgreSQL went away and came back returns the
machine the first one made; `fsm-celery start --key` says whether it started or found it."""

from __future__ import annotations

import shutil
import tempfile
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from uuid import UUID

import pytest
import sqlalchemy.exc
from click.testing import CliRunner, Result
from sqlalchemy import func, select

from fsm_celery import cli
from fsm_celery.api import default_client
from fsm_celery.config import get_settings
from fsm_celery.store.start_keys import start_keys
from fsm_celery.store.tables import machines
from tests.integration.conftest import ONE_MODE
from tests.support.agents import ScriptedAgent
from tests.support.databases import create_template
from tests.support.processes import FsmEnv, make_env
from tests.support.services import Postgres, Services

RACERS = 8


def _machines_of(env: FsmEnv, key: str) -> int:
    """How many machines hold the key (through its row) and how many keys it has: one each."""
    with env.client.engine.db.connect() as conn:
        held = conn.execute(
            select(func.count())
            .select_from(start_keys.join(machines, machines.c.id == start_keys.c.machine_id))
            .where(start_keys.c.key == key)
        ).scalar_one()
    return int(held)


@ONE_MODE
def test_eight_clients_starting_with_one_key_make_one_machine_entered_once(fsm: FsmEnv) -> None:
    key = f"race-{uuid.uuid4().hex[:8]}"
    gate = threading.Barrier(RACERS)
    ids: list[UUID] = []
    errors: list[BaseException] = []

    with ScriptedAgent(fsm) as agent:

        def start() -> None:
            try:
                gate.wait(30)
                ids.append(fsm.client.start_machine("test_pair", {"n": 1}, agent.id, key=key))
            except BaseException as exc:  # reported below, in the test's thread
                errors.append(exc)

        racers = [threading.Thread(target=start) for _ in range(RACERS)]
        for racer in racers:
            racer.start()
        for racer in racers:
            racer.join(60)
        assert errors == [] and len(ids) == RACERS
        [mid] = set(ids)
        assert fsm.wait_until_done(mid).status == "completed"
    assert _machines_of(fsm, key) == 1
    assert [row.event for row in fsm.client.history(mid)] == ["start", "ack", "ack"]
    assert [t["state"] for t in agent.tasks if t["machineId"] == str(mid)] == ["FIRST", "SECOND"]


@pytest.fixture
def own_postgres(services: Services) -> Iterator[tuple[FsmEnv, Postgres]]:
    """A deployment (no process: the client alone) on a PostgreSQL server of the test's own."""
    directory = Path(tempfile.mkdtemp(prefix="fsm-celery-pg-"))  # not tmp_path: 0700
    server = Postgres(directory / "postgres").init().start()
    create_template(server.url, "template_fsm")
    env = make_env("start_keys_restart", server.url, "template_fsm", services.redis_url)
    yield env, server
    env.stop_all()
    env.client.engine.db.dispose()
    server.stop()
    shutil.rmtree(directory, ignore_errors=True)


def test_a_start_repeated_across_a_postgres_restart_returns_the_first_machine(
    own_postgres: tuple[FsmEnv, Postgres],
) -> None:
    env, server = own_postgres
    first = env.client.start_machine("test_linear", {"order": 7}, key="order-7")
    server.stop()  # the client that asks again now gets no answer: it will ask once more
    with pytest.raises(sqlalchemy.exc.OperationalError):
        env.client.start_machine("test_linear", {"order": 7}, key="order-7")
    with pytest.raises(sqlalchemy.exc.OperationalError):  # never written: nothing to find
        env.client.start_machine("test_linear", {"order": 8}, key="order-8")
    server.start()
    assert env.client.start_machine("test_linear", {"order": 7}, key="order-7") == first
    second = env.client.start_machine("test_linear", {"order": 8}, key="order-8")
    assert env.client.start_machine("test_linear", {"order": 8}, key="order-8") == second
    assert (_machines_of(env, "order-7"), _machines_of(env, "order-8")) == (1, 1)
    assert len(env.client.list_machines(machine_type="test_linear")) == 2


Cli = Callable[..., Result]


@pytest.fixture
def run(fsm: FsmEnv, monkeypatch: pytest.MonkeyPatch) -> Iterator[Cli]:
    """The CLI as its users run it: its client built from the deployment's FSM_* variables."""
    for name, value in fsm.env.items():
        if name.startswith("FSM_"):
            monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    default_client.cache_clear()

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(cli.main, list(args))

    yield invoke
    if default_client.cache_info().currsize:
        default_client().engine.db.dispose()
    default_client.cache_clear()
    get_settings.cache_clear()


@ONE_MODE
def test_cli_start_with_a_key_says_whether_it_started_or_found_the_machine(
    fsm: FsmEnv, run: Cli
) -> None:
    key = f"cli-{uuid.uuid4().hex[:8]}"
    started = run("start", "test_pair", "--context", '{"a": 1}', "--key", key)
    assert started.exit_code == 0, started.output
    assert f"started: key {key!r} now holds this machine" in started.stderr
    found = run("start", "test_pair", "--context", '{"a": 1}', "--key", key)
    assert found.exit_code == 0, found.output
    assert found.stdout == started.stdout
    assert f"found: key {key!r} started this machine before; nothing new" in found.stderr
    mid = started.stdout.strip()
    shown = run("status", mid)
    assert f"key            {key}" in shown.stdout
    refused = run("start", "test_linear", "--context", '{"a": 1}', "--key", key)
    assert refused.exit_code == 1
    assert f"holds machine {mid} (a test_pair), started with another type" in refused.stderr
    assert _machines_of(fsm, key) == 1
