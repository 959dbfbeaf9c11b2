"""`fsm-celery dev DIR`: a PostgreSQL and a Redis for development, started in a folder as the
current user (root included: initdb refuses root, so PostgreSQL runs as `postgres`), whose
printed settings a deployment runs on, stopped by SIGTERM and started again on the same data
and secret."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import ROOT
from tests.support.services import HOST, free_port

WAIT = 90.0  # seconds for the servers to start, at most


@pytest.fixture
def directory() -> Iterator[Path]:
    # Not under pytest's tmp_path: its /tmp/pytest-of-root is 0700, which `postgres` (the
    # server's user when the suite runs as root) cannot enter.
    made = Path(tempfile.mkdtemp(prefix="fsm-dev-"))
    made.chmod(0o755)
    yield made / "stack"
    shutil.rmtree(made, ignore_errors=True)


def _environ() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith(("FSM_", "XDG_"))}


def _start(directory: Path, pg_port: int, redis_port: int) -> subprocess.Popen[str]:
    argv = [sys.executable, "-m", "fsm_celery", "dev", str(directory)]
    argv += ["--pg-port", str(pg_port), "--redis-port", str(redis_port)]
    return subprocess.Popen(
        argv, cwd=ROOT, env=_environ(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )


def _settings(dev: subprocess.Popen[str]) -> dict[str, str]:
    """The `export` lines it printed, once it says the servers run."""
    assert dev.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + WAIT
    while not any("Ctrl-C" in line for line in lines):
        assert time.monotonic() < deadline and dev.poll() is None, "".join(lines)
        lines.append(dev.stdout.readline())
    pairs = (line.removeprefix("export ").strip().partition("=") for line in lines)
    return {name: value for name, _, value in pairs if name.startswith("FSM_")}


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex((HOST, port)) == 0


def _stop(dev: subprocess.Popen[str]) -> tuple[int, str]:
    """SIGTERM it; its exit status and what it printed from then on (stdout and stderr)."""
    dev.send_signal(signal.SIGTERM)
    said, _ = dev.communicate(timeout=60)
    return dev.returncode, said


def test_dev_runs_postgres_and_redis_a_deployment_uses_and_stops_them(directory: Path) -> None:
    pg_port, redis_port = free_port(), free_port()
    dev = _start(directory, pg_port, redis_port)
    try:
        settings = _settings(dev)
        assert set(settings) == {
            "FSM_DATABASE_URL",
            "FSM_REDIS_URL",
            "FSM_TASK_TOKEN_SECRET",
            "FSM_STATE_DIR",
        }
        upgraded = subprocess.run(
            [sys.executable, "-m", "fsm_celery", "db", "upgrade"],
            cwd=ROOT,
            env=_environ() | settings,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert upgraded.returncode == 0, upgraded.stdout + upgraded.stderr
        assert (directory / "env").stat().st_mode & 0o777 == 0o600  # it holds the secret
        code, said = _stop(dev)
        assert code == 0 and "stopped PostgreSQL and Redis" in said, said
        assert not _listening(pg_port) and not _listening(redis_port)

        again = _start(directory, pg_port, redis_port)  # the same data, the same secret
        try:
            assert _settings(again) == settings
        finally:
            code, said = _stop(again)
            assert code == 0 and "stopped PostgreSQL and Redis" in said, said
    finally:
        if dev.poll() is None:
            dev.kill()
            dev.wait()
        if dev.stdout is not None:
            dev.stdout.close()


@pytest.mark.skipif(os.geteuid() != 0, reason="as root alone, PostgreSQL runs as another user")
def test_as_root_a_folder_postgres_cannot_enter_is_refused_naming_it(directory: Path) -> None:
    closed = directory.parent / "closed"
    closed.mkdir(mode=0o700)
    done = subprocess.run(
        [sys.executable, "-m", "fsm_celery", "dev", str(closed / "stack")],
        cwd=ROOT,
        env=_environ(),
        capture_output=True,
        text=True,
        timeout=WAIT,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert done.stderr.startswith(
        f"error: postgres: PostgreSQL runs as the OS user 'postgres', which cannot enter {closed}"
    ), done.stderr
