"""`fsm-celery init DIR` writes a folder every process starts from: the dashboard and Flower
come up with nothing but its .env loaded (besides where this suite's servers are), run from
that folder as the .env says, and read its definitions through their relative path."""

from __future__ import annotations

import base64
import os
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fsm_celery.core.loader import SHIPPED_DEFINITIONS, definition_files
from tests.support.processes import FsmEnv

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder written by the real `fsm-celery init`."""
    parent = tmp_path_factory.mktemp("init")
    done = subprocess.run(
        [str(BIN / "fsm-celery"), "init", "site"],
        cwd=parent,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert "fsm-celery db upgrade --create" in done.stdout
    return parent / "site"


def _dotenv(site: Path) -> dict[str, str]:
    lines = (site / ".env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


def _from_site(site: Path, env: FsmEnv, command: str, log: Path) -> subprocess.Popen[bytes]:
    """The command run from the folder as its .env says (`set -a; . ./.env; set +a`), with
    only the suite's servers put in place of the .env's, and nothing else of the suite's."""
    servers = {
        "FSM_DATABASE_URL": env.settings.database_url,
        "FSM_REDIS_URL": env.settings.redis_url,
        "FSM_QUEUE": env.settings.queue,
        "FSM_CHANNEL_PREFIX": env.settings.channel_prefix,
    }
    exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in servers.items())
    script = f"set -a; . ./.env; set +a; export {exports}; exec {command}"
    environ = {"PATH": f"{BIN}:{os.environ['PATH']}", "HOME": str(site)}
    with log.open("wb") as handle:
        return subprocess.Popen(
            ["sh", "-c", script],
            cwd=site,
            env=environ,
            stdout=handle,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )


@pytest.fixture
def running(site: Path, tmp_path: Path) -> Iterator[Callable[..., tuple[int, Path]]]:
    """Start a command from the site on a free port; stopped at the end."""
    started: list[subprocess.Popen[bytes]] = []

    def start(env: FsmEnv, command: str) -> tuple[int, Path]:
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        log = tmp_path / f"{len(started)}.log"
        started.append(_from_site(site, env, command.format(port=port), log))
        return port, log

    yield start
    for process in started:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGTERM)
            process.wait(timeout=30)


def _get(url: str, header: str | None) -> int:
    request = urllib.request.Request(url)
    if header:
        request.add_header("Authorization", header)
    deadline = time.monotonic() + 30
    while True:
        try:
            with urllib.request.urlopen(request, timeout=5) as response:
                return int(response.status)
        except urllib.error.HTTPError as refused:
            refused.close()
            return refused.code
        except (urllib.error.URLError, ConnectionError):
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_dashboard_starts_from_the_init_folder(
    site: Path, env_factory: Callable[..., FsmEnv], running: Callable[..., tuple[int, Path]]
) -> None:
    env = env_factory("init_dashboard")
    dotenv = _dotenv(site)
    port, log = running(env, "fsm-celery dashboard --port {port}")
    url = f"http://127.0.0.1:{port}/api/machines"
    assert _get(url, f"Bearer {dotenv['FSM_ADMIN_TOKEN']}") == 200, log.read_text()
    assert _get(url, f"Bearer {dotenv['FSM_VIEWER_TOKEN']}") == 200
    assert _get(url, None) == 401


def test_flower_starts_from_the_init_folder_behind_its_password(
    site: Path, env_factory: Callable[..., FsmEnv], running: Callable[..., tuple[int, Path]]
) -> None:
    env = env_factory("init_flower")
    credentials = _dotenv(site)["FLOWER_BASIC_AUTH"]
    port, log = running(env, "celery -A fsm_celery flower --address=127.0.0.1 --port={port}")
    url = f"http://127.0.0.1:{port}/api/workers"
    basic = "Basic " + base64.b64encode(credentials.encode()).decode()
    assert _get(url, basic) == 200, log.read_text()
    assert _get(url, None) == 401


def test_the_definitions_path_is_the_folders_own(tmp_path: Path) -> None:
    init = [str(BIN / "fsm-celery"), "init", "own"]
    assert subprocess.run(init, cwd=tmp_path, capture_output=True, timeout=60).returncode == 0
    own = tmp_path / "own"
    (own / "definitions" / "cto_fix_bug.yaml").unlink()  # this folder's, not the shipped ones
    done = subprocess.run(
        ["sh", "-c", "set -a; . ./.env; set +a; exec fsm-celery definitions validate"],
        cwd=own,
        env={"PATH": f"{BIN}:{os.environ['PATH']}"},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    shipped = len(definition_files(SHIPPED_DEFINITIONS))
    assert done.stdout.count("ok  ") == shipped - 1 and "cto_fix_bug" not in done.stdout
