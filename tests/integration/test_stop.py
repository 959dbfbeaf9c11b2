"""`fsm-celery stop` stops what this deployment started, by its own records, and nothing of
another deployment of the same OS user on the same host (README's old `pkill -f` stopped
both). A worker started with `--detach` is found too: it left no pidfile anyone could find."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from fsm_celery import processes
from fsm_celery.config import Settings
from tests.support import ROOT
from tests.support.services import Services

WAIT = 60.0  # seconds to wait for a process to start or to stop, at most


def _deployment(services: Services, home: Path, name: str) -> dict[str, str]:
    """A deployment's environment: its own queue and channel prefix, the shared state home."""
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("FSM_", "XDG_"))}
    environ.update(
        FSM_TASK_TOKEN_SECRET=os.environ["FSM_TASK_TOKEN_SECRET"],
        FSM_REDIS_URL=services.redis_url,
        FSM_QUEUE=f"fsm-stop-{name}-{os.getpid()}",  # nobody else's queue
        FSM_CHANNEL_PREFIX=f"stop-{name}-{os.getpid()}:",
        XDG_STATE_HOME=str(home),
    )
    return environ


def _state_directory(environ: dict[str, str]) -> Path:
    """Where the deployment keeps its state: its own folder in $XDG_STATE_HOME/fsm-celery."""
    deployment = Settings(
        task_token_secret=environ["FSM_TASK_TOKEN_SECRET"],
        redis_url=environ["FSM_REDIS_URL"],
        queue=environ["FSM_QUEUE"],
        channel_prefix=environ["FSM_CHANNEL_PREFIX"],
        database_url=Settings.model_fields["database_url"].default,
    ).deployment
    return Path(environ["XDG_STATE_HOME"]) / "fsm-celery" / deployment


def _recorded(directory: Path, kinds: list[str]) -> list[processes.Record]:
    deadline = time.monotonic() + WAIT
    while True:
        found = processes.running(directory)
        if sorted(r.kind for r in found) == sorted(kinds):
            return found
        assert time.monotonic() < deadline, f"recorded: {found}, expected {kinds}"
        time.sleep(0.2)


def _cli(environ: dict[str, str], *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsm_celery", *argv],
        env=environ,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=WAIT * 2,
    )


def test_stop_stops_this_deployments_processes_and_no_other(
    services: Services, tmp_path: Path
) -> None:
    home = tmp_path / "state"
    mine, theirs = _deployment(services, home, "mine"), _deployment(services, home, "theirs")
    beat = [sys.executable, "-m", "celery", "-A", "fsm_celery", "beat", "-l", "info"]
    log = (tmp_path / "beat.log").open("wb")
    my_beat = subprocess.Popen(beat, cwd=tmp_path, env=mine, stdout=log, stderr=log)
    their_beat = subprocess.Popen(beat, cwd=tmp_path, env=theirs, stdout=log, stderr=log)
    detach = [sys.executable, "-m", "celery", "-A", "fsm_celery", "worker", "-Q", mine["FSM_QUEUE"]]
    detach += ["--detach", "--logfile", str(tmp_path / "worker.log")]
    try:
        subprocess.run(detach, cwd=tmp_path, env=mine, check=True, timeout=WAIT)
        my_directory, their_directory = _state_directory(mine), _state_directory(theirs)
        assert my_directory != their_directory
        recorded = _recorded(my_directory, ["beat", "worker"])
        [their_record] = _recorded(their_directory, ["beat"])

        stopped = _cli(mine, "stop")

        assert stopped.returncode == 0, stopped.stdout + stopped.stderr
        assert stopped.stdout.splitlines()[-1] == "stopped 2"
        assert my_beat.wait(WAIT) is not None
        assert not any(r.alive() for r in recorded)  # the detached worker too
        assert their_beat.poll() is None and their_record.alive()  # another deployment's
        assert processes.running(my_directory) == []
        assert _cli(mine, "stop").stdout.startswith("nothing of this deployment runs")
        assert _cli(theirs, "stop").returncode == 0
        assert their_beat.wait(WAIT) is not None
    finally:
        for process in (my_beat, their_beat):
            if process.poll() is None:
                process.kill()
                process.wait()
        for directory in (home / "fsm-celery").glob("*"):
            for record in processes.running(directory):
                os.kill(record.pid, signal.SIGKILL)
        for left in psutil.process_iter(["cmdline"]):  # a worker stop missed, recorded or not
            if mine["FSM_QUEUE"] in " ".join(left.info["cmdline"] or []):
                left.kill()
        log.close()
    assert list(tmp_path.glob("*.pid")) == []  # nothing left where they were started
