"""Tool states against a real MCP server (tests/support/tool_server.py), called by a real
Celery worker's fsm.call_tool task: over stdio (the worker starts the server) in the celery
mode, over streamable HTTP in the inline mode (the bridge enters the state, a worker calls).
A machine to COMPLETE with each call in its history (the tool as actor, the rendered
arguments as reason), a failed call retried, a plain-text result, a result that breaks its
contract failed, and a call past its deadline timed out."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from tests.support import ROOT
from tests.support.processes import FsmEnv
from tests.support.services import free_port

SERVER = [sys.executable, "-m", "tests.support.tool_server"]


@pytest.fixture(scope="module")
def http_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The tool server over streamable HTTP: its URL."""
    port = free_port()
    state = tmp_path_factory.mktemp("tool-http")
    proc = subprocess.Popen(
        [*SERVER, "--http", str(port)],
        cwd=ROOT,
        env={"TOOL_STATE_DIR": str(state), "PATH": "/usr/bin:/bin"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    url = f"http://127.0.0.1:{port}/mcp"
    deadline = time.monotonic() + 30
    while True:
        try:
            httpx.get(url, timeout=1)
            break
        except httpx.TransportError:
            assert proc.poll() is None, "the tool server exited"
            assert time.monotonic() < deadline, "the tool server did not start"
            time.sleep(0.2)
    yield url
    proc.terminate()
    proc.wait(10)


def deployment(
    env_factory: Callable[..., FsmEnv], name: str, mode: str, server: dict[str, object]
) -> FsmEnv:
    env = env_factory(name, transition_mode=mode, mcp_servers={"checks": server})
    env.start_worker()
    env.start_bridge()
    return env


def stdio_server(folder: Path) -> dict[str, object]:
    return {"command": SERVER, "cwd": str(ROOT), "env": {"TOOL_STATE_DIR": str(folder)}}


@pytest.mark.parametrize("mode", ["celery", "inline"])
def test_a_machine_of_tool_states_completes_with_each_call_in_its_history(
    env_factory: Callable[..., FsmEnv], http_server: str, tmp_path: Path, mode: str
) -> None:
    server = stdio_server(tmp_path) if mode == "celery" else {"url": http_server}
    env = deployment(env_factory, f"tools_{mode}", mode, server)
    try:
        context = {"projectName": "sla-api", "githubIssue": 740, "key": f"k-{mode}"}
        mid = env.client.start_machine("test_tool", context)
        info = env.wait_until_done(mid, timeout=90)
        assert info.status == "completed", info.error
        rows = [r for r in env.client.history(mid) if r.attempt > 0]
        run, *flaky, echo = rows
        assert (run.from_state, run.event, run.actor) == (
            "RUN_TESTS",
            "ack",
            "mcp:checks/run_tests",
        )
        assert json.loads(run.reason or "") == {"project": "sla-api", "issue": 740}  # an int
        assert run.output is not None and run.output["passed"] is True
        assert run.output["coverage"] == 87
        # the flaky tool failed once (its error recorded), and the state's retry called again
        assert [(r.from_state, r.success) for r in flaky] == [("FLAKY", False), ("FLAKY", True)]
        assert "the first call for" in (flaky[0].error_message or "")
        assert flaky[1].output == {"calls": 2}
        assert echo.output == {"text": "fixed #740"}  # plain text, kept as text
        assert echo.to_state == "DONE"
    finally:
        env.stop_all()


def test_a_result_that_breaks_its_contract_and_a_call_past_its_deadline_fail(
    env_factory: Callable[..., FsmEnv], tmp_path: Path
) -> None:
    env = deployment(env_factory, "tools_bad", "celery", stdio_server(tmp_path))
    try:
        mid = env.client.start_machine("test_tool_bad", {})
        info = env.wait_until_done(mid, timeout=90)
        assert info.status == "failed"
        check, slow = [r for r in env.client.history(mid) if r.attempt > 0]
        assert (check.from_state, check.failure, check.to_state) == (
            "CHECK",
            "invalid_output",
            "SLOW",
        )
        assert "/passed" in (check.error_message or "")  # the contract's problem, by pointer
        assert check.actor == "mcp:checks/says_yes"
        assert (slow.from_state, slow.event, slow.to_state) == ("SLOW", "timeout", "FAILED")
    finally:
        env.stop_all()
