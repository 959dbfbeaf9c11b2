"""The newcomer's first command: the embedded demo runs every machine to its end, serverless."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fsm_celery.agent.mock import ASPECTS
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
    # one machine of each shipped definition, a second build, and a second research pipeline
    # worked by the LLM agent against the demo's scripted chat endpoint
    assert len(finished) == 8, done.stdout
    assert any("research_pipeline#5" in line for line in finished)
    assert any("research_fanout#7" in line for line in finished)
    [llm] = [line.split("│") for line in finished if "research_pipeline#8" in line]
    assert int(llm[5]) > 0, llm  # the tokens the model's answers used, recorded on the machine
    # the map researched every sub-question, its join handing one finding each to the analyzer
    joined = f"RESEARCHING -> ANALYZING  (joined: {len(ASPECTS)} findings)"
    assert any(line.endswith(joined) for line in lines), done.stdout
    assert any(
        line.endswith("TESTS_AND_DOCS -> RUN_TESTS  (joined: tests, docs)") for line in lines
    )
    assert any("RUN_TESTS -> WRITE_CODE  (injected failure in RUN_TESTS" in line for line in lines)
    assert any("ANALYZE_ISSUE -> CREATE_PROJECT" in line for line in lines)
