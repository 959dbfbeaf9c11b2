"""Acceptance: no long-running process starts with a task token secret anyone could know, and
each says in one line how to set one; a rotated-out secret is still accepted."""

from __future__ import annotations

import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

from fsm_celery.config import DEFAULT_SECRET
from tests.support import ROOT

PROCESSES = {
    "worker": [sys.executable, "-m", "celery", "-A", "fsm_celery", "worker", "--pool", "solo"],
    "beat": [sys.executable, "-m", "celery", "-A", "fsm_celery", "beat"],
    "ack-bridge": [sys.executable, "-m", "fsm_celery", "ack-bridge"],
}
DASHBOARD = [sys.executable, "-m", "fsm_celery", "dashboard", "--port", "1"]
UNFIT = {
    "the default": DEFAULT_SECRET,
    "empty": "",
    "31 bytes": "x" * 31,
    "a short one among the rotated": "y" * 40 + ",short",
    "one repeated character": "z" * 32,
    "a repeated pattern": "abcabc" * 8,
}


@pytest.mark.parametrize(
    ("process", "secret"),
    [
        ("worker", "the default"),
        ("beat", "empty"),
        ("ack-bridge", "31 bytes"),
        ("ack-bridge", "a short one among the rotated"),
        ("worker", "one repeated character"),
        ("ack-bridge", "a repeated pattern"),
    ],
)
def test_a_long_running_process_refuses_a_guessable_secret(
    process: str, secret: str, tmp_path: Path
) -> None:
    env = {**os.environ, "FSM_TASK_TOKEN_SECRET": UNFIT[secret]}
    argv = PROCESSES[process] + (["-s", str(tmp_path / "beat")] if process == "beat" else [])
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3  # bad configuration, as for every fsm-celery command
    assert "Traceback" not in done.stderr
    assert "FSM_TASK_TOKEN_SECRET" in done.stderr
    assert "token_hex(32)" in done.stderr  # how to set one


@pytest.mark.parametrize(
    ("argv", "setting", "value", "says"),
    [
        (PROCESSES["beat"], "FSM_NOTIFY_SECRET", "n" * 30 + "abcdefghij", "more than half one"),
        (DASHBOARD, "FSM_ADMIN_TOKEN", "a" * 40, "fewer than 8 different characters"),
        (DASHBOARD, "FSM_VIEWER_TOKEN", "viewer-token-" + "v" * 40, "more than half one"),
        (DASHBOARD, "FSM_SESSION_SECRET", "s" * 64, "fewer than 8 different characters"),
        (DASHBOARD, "FSM_SESSION_SECRET", "0123456789abcdef", "shorter than 32 bytes"),
        (DASHBOARD, "FSM_GITHUB_WEBHOOK_SECRET", "abababab", "fewer than 8 different"),
    ],
)
def test_every_secret_setting_refuses_a_repeated_character_in_one_line(
    argv: list[str], setting: str, value: str, says: str, tmp_path: Path
) -> None:
    env = {**os.environ, "FSM_ADMIN_TOKEN": secrets.token_urlsafe(32), setting: value}
    argv = argv + (["-s", str(tmp_path / "beat")] if argv is PROCESSES["beat"] else [])
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    [line] = done.stderr.strip().splitlines()
    assert f"error: {setting} " in line and says in line, line  # beat's log prefixes it
    assert f"set {setting}" in line or f"export {setting}=" in line  # the fix names it too
    assert value not in line  # a secret is never echoed


@pytest.mark.parametrize(
    ("process", "setting", "value", "says"),
    [
        ("worker", "FSM_MAX_PAYLOAD_BYTES", "abc", "FSM_MAX_PAYLOAD_BYTES"),
        ("beat", "FSM_DATABASE_URL", "not a url", "postgresql://"),
        ("worker", "FSM_REDIS_URL", "http://127.0.0.1:6379", "redis://"),
    ],
)
def test_a_celery_process_with_a_bad_setting_says_which_in_one_line(
    process: str, setting: str, value: str, says: str, tmp_path: Path
) -> None:
    argv = PROCESSES[process] + (["-s", str(tmp_path / "beat")] if process == "beat" else [])
    env = {**os.environ, setting: value}
    done = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert "Traceback" not in done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"error: {setting}: ") and says in line, line
