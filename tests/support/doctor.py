"""`fsm-celery doctor` run for real in a deployment's environment."""

from __future__ import annotations

import subprocess
import sys

from tests.support import ROOT
from tests.support.processes import FsmEnv

DOCTOR = [sys.executable, "-m", "fsm_celery", "doctor"]


def run_doctor(env: FsmEnv, **overrides: str) -> subprocess.CompletedProcess[str]:
    """What the command printed and its exit status (the environment's settings, overridden)."""
    return subprocess.run(
        DOCTOR,
        cwd=ROOT,
        env={**env.env, **overrides},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def by_check(printed: str) -> dict[str, str]:
    """Each check's line, by the check's name."""
    return {line[2:].split(":", 1)[0]: line for line in printed.splitlines()}
