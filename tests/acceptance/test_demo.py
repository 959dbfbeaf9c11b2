"""The newcomer's first command: the embedded demo runs every machine to its end, serverless;
without the `mcp` extra, all but the one worked over MCP, saying why."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from fsm_celery.agent.mock import ASPECTS
from fsm_celery.core.loader import SHIPPED_DEFINITIONS
from fsm_celery.demo import MCP_SKIPPED

ROOT = Path(__file__).resolve().parents[2]
DEMO = ["demo", "--definitions", str(SHIPPED_DEFINITIONS)]
# the command line with the `mcp` package made unimportable, as where the extra is missing
WITHOUT_MCP = "import sys; sys.modules['mcp'] = None; from fsm_celery.cli import main; main()"


def _demo(*argv: str) -> tuple[list[str], list[str]]:
    """The demo's lines, and its summary's machines that completed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSM_")}
    env["FSM_DATABASE_URL"] = "postgresql+psycopg2://nobody@127.0.0.1:1/none"  # must not be used
    env["FSM_REDIS_URL"] = "redis://127.0.0.1:1/0"  # must not be used
    done = subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, timeout=120, env=env, cwd=ROOT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    summary = lines[next(i for i, line in enumerate(lines) if "Summary" in line) :]
    return lines, [line for line in summary if "│ completed │" in line]


def test_demo_runs_every_machine_to_completion_without_servers() -> None:
    lines, finished = _demo("-m", "fsm_celery", *DEMO)
    # one machine of each shipped definition, a second build, a second research pipeline
    # worked by the LLM agent against the demo's scripted chat endpoint, and a second bug fix
    # worked through the MCP agent door by a scripted coding agent
    assert len(finished) == 9, lines
    assert any("research_pipeline#5" in line for line in finished)
    assert any("research_fanout#7" in line for line in finished)
    [llm] = [line.split("│") for line in finished if "research_pipeline#8" in line]
    assert int(llm[5]) > 0, llm  # the tokens the model's answers used, recorded on the machine
    # the map researched every sub-question, its join handing one finding each to the analyzer
    joined = f"RESEARCHING -> ANALYZING  (joined: {len(ASPECTS)} findings)"
    assert any(line.endswith(joined) for line in lines), lines
    assert any(
        line.endswith("TESTS_AND_DOCS -> RUN_TESTS  (joined: tests, docs)") for line in lines
    )
    assert any("RUN_TESTS -> WRITE_CODE  (injected failure in RUN_TESTS" in line for line in lines)
    assert any("ANALYZE_ISSUE -> CREATE_PROJECT" in line for line in lines)
    # the coding agent's first RUN_TESTS answer refused by submit, then corrected
    mcp = [line for line in lines if "cto_fix_bug#9" in line]
    refused = "RUN_TESTS    submit refused over MCP: /passed: 'yes' is not of type 'boolean'"
    at = next(i for i, line in enumerate(mcp) if refused in line)
    assert mcp[at + 1].endswith("RUN_TESTS -> COMMIT_PUSH"), mcp
    assert any("cto_fix_bug#9" in line for line in finished)


def test_without_the_mcp_extra_the_demo_runs_the_rest_and_says_why() -> None:
    lines, finished = _demo("-c", WITHOUT_MCP, *DEMO)
    assert any(line.startswith(MCP_SKIPPED) for line in lines), lines
    assert "pip install 'fsm-celery[mcp]'" in "\n".join(lines)
    assert len(finished) == 8, lines
    assert not any("#9" in line for line in lines)
