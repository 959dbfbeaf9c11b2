"""`fsm-celery dev`'s stop: no problem when the servers exit on SIGINT; one naming the server
(and that it was killed) when one does not."""

from __future__ import annotations

import subprocess
import sys

import pytest

from fsm_celery import devstack

EXITS_ON_SIGINT = (
    "import signal, sys, time\nsignal.signal(signal.SIGINT, lambda *_: sys.exit(0))\n"
    "print('ready', flush=True)\ntime.sleep(300)\n"
)
IGNORES_SIGINT = (
    "import signal, sys, time\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
    "print('ready', flush=True)\ntime.sleep(300)\n"
)


def _python(code: str) -> subprocess.Popen[bytes]:
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE)


def test_servers_that_exit_on_sigint_stop_with_no_problem() -> None:
    with _python(EXITS_ON_SIGINT) as process:
        assert process.stdout is not None and process.stdout.readline() == b"ready\n"
        assert devstack.stop([process]) == []
    assert process.returncode == 0


def test_a_server_that_does_not_exit_is_killed_and_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(devstack, "STOP_SECONDS", 1.0)
    with _python(IGNORES_SIGINT) as stubborn:
        assert stubborn.stdout is not None and stubborn.stdout.readline() == b"ready\n"
        problems = devstack.stop([stubborn])
    assert stubborn.returncode == -9
    assert len(problems) == 1
    assert problems[0].startswith("python") and f"(pid {stubborn.pid})" in problems[0]
    assert "killed" in problems[0]
