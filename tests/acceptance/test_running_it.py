"""README's "Running it", command by command, on a database that does not exist yet: the
database is created, the worker started with `-Q fsm` also runs beat's scan, a mock agent
serves every shipped agent type, doctor is green, and a machine completes."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from fsm_celery import wiring
from fsm_celery.config import Settings
from tests.support.services import Services

BIN = Path(sys.executable).parent
UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


@pytest.fixture
def shell(services: Services, tmp_path: Path) -> Iterator[dict[str, str]]:
    """The environment "Running it" exports, on this suite's servers and a database that does
    not exist (dropped at the end), with a queue and prefix nobody else uses."""
    name = f"fsm_running_it_{os.getpid()}"
    drop_database(services.pg_url, name)
    tag = f"running-it-{os.getpid()}"
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FSM_")}
    environ.update(
        PATH=f"{BIN}:{os.environ['PATH']}",
        FSM_DATABASE_URL=f"{services.pg_url}/{name}",
        FSM_REDIS_URL=services.redis_url,
        FSM_TASK_TOKEN_SECRET=os.environ["FSM_TASK_TOKEN_SECRET"],
        FSM_QUEUE=tag,
        FSM_CHANNEL_PREFIX=f"{tag}:",
        FSM_STATE_DIR=str(tmp_path / "state"),
    )
    yield environ
    drop_database(services.pg_url, name)


def drop_database(pg_url: str, name: str) -> None:
    server = create_engine(f"{pg_url}/postgres", isolation_level="AUTOCOMMIT")
    with server.connect() as conn:
        conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    server.dispose()


def _run(environ: dict[str, str], cwd: Path, *argv: str) -> str:
    done = subprocess.run(argv, cwd=cwd, env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, f"{argv}: {done.stdout}{done.stderr}"
    return done.stdout


def test_running_it_from_an_empty_server_to_a_completed_machine(
    shell: dict[str, str], tmp_path: Path
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    created = _run(shell, work, "fsm-celery", "db", "upgrade", "--create")
    assert created.splitlines()[0].startswith("created database fsm_running_it_")
    _run(shell, work, "fsm-celery", "definitions", "load")
    background = [  # -Q FSM_QUEUE: README's `-Q fsm`, on a queue of this test's own
        ["celery", "-A", "fsm_celery", "worker", "-Q", shell["FSM_QUEUE"], "-l", "info"],
        ["celery", "-A", "fsm_celery", "beat", "-l", "info"],
        ["fsm-celery", "ack-bridge"],
        ["fsm-celery", "agent", "--mock"],
    ]
    processes = []
    try:
        for i, argv in enumerate(background):
            with (tmp_path / f"{argv[0]}-{i}.log").open("wb") as log:
                processes.append(
                    subprocess.Popen(
                        argv,
                        cwd=work,
                        env=shell,
                        stdout=log,
                        stderr=subprocess.STDOUT,
                        start_new_session=True,
                    )
                )
        _until_doctor_is_green(shell, work, tmp_path)
        started = _run(shell, work, "fsm-celery", "start", "cto_infrastructure_check")
        machine = UUID.search(started)
        assert machine, started
        client = wiring.client(Settings(database_url=shell["FSM_DATABASE_URL"]))
        deadline = time.monotonic() + 60
        while (info := client.get_machine(machine.group())).status not in ("completed", "failed"):
            assert time.monotonic() < deadline, info
            time.sleep(0.2)
        assert info.status == "completed"
        client.engine.db.dispose()
    finally:
        for process in processes:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGTERM)
        for process in processes:
            process.wait(timeout=60)
    assert list(work.iterdir()) == []  # beat's schedule went to FSM_STATE_DIR


def _until_doctor_is_green(environ: dict[str, str], cwd: Path, logs: Path) -> None:
    deadline = time.monotonic() + 90
    while True:
        done = subprocess.run(
            ["fsm-celery", "doctor"], cwd=cwd, env=environ, capture_output=True, text=True
        )
        if done.returncode == 0:
            return
        if time.monotonic() > deadline:
            shown = "".join(p.read_text(errors="replace")[-2000:] for p in logs.glob("*.log"))
            raise AssertionError(done.stdout + shown)
        time.sleep(1)
