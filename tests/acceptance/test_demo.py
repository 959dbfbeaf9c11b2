"""The newcomer's first command: the embedded demo runs every machine to its end, serverless."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fsm_celery.core.loader import SHIPPED_DEFINITIONS

ROOT = Path(__file__).resolve().parents[2]


def test_demo_runs_every_machine_to_completion_without_servers() -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSM_")}
    env["FSM_DATABASE_URL"] = "postgresql+psycopg2://nobody@127.0.0.1:1/none"  # must not be used
    env["FSM_REDIS_URL"] = "redis://127.0.0.1:1/0"  # must not be used
    done = subprocess.run(
        [sys.executable, "-m", "fsm_celery", "demo", "--definitions", str(SHIPPED_DEFINITIONS)],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    summary = lines[next(i for i, line in enumerate(lines) if "Summary" in line) :]
    finished = [line for line in summary if "│ completed │" in line]
    assert len(finished) == 5, done.stdout  # one machine of each shipped definition, and two
    assert any("research_pipeline#5" in line for line in finished)
    assert any("RUN_TESTS -> WRITE_CODE  (injected failure in RUN_TESTS" in line for line in lines)
    assert any("ANALYZE_ISSUE -> CREATE_PROJECT" in line for line in lines)
