"""An MCP server of tools for tool states' tests, as a deployment would run one: over stdio
(`python -m tests.support.tool_server`), or streamable HTTP (`... --http PORT`).

- `run_tests(project, issue)`: a structured result (its output schema declared);
- `flaky(key)`: fails (an error result) the first time it is called for a key, then succeeds:
  the calls are counted in files under TOOL_STATE_DIR, so that every process agrees;
- `slow(seconds)`: answers after that long (past a deadline, the attempt times out);
- `says_yes()`: `{"passed": "yes"}`, which breaks a contract that wants a boolean;
- `echo(text)`: plain text, not JSON;
- `calls(key)`: how many times `flaky` was called for the key.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from pydantic import BaseModel

server = MCPServer("fsm-celery test tools", log_level="WARNING")


class TestRun(BaseModel):
    passed: bool
    coverage: int
    project: str
    issue: int


def _counter(key: str) -> Path:
    folder = Path(os.environ.get("TOOL_STATE_DIR", "/tmp/fsm-tool-state"))
    folder.mkdir(parents=True, exist_ok=True)
    return folder / f"{key}.count"


@server.tool()
def run_tests(project: str, issue: int) -> TestRun:
    """Run the project's tests for the issue's fix."""
    return TestRun(passed=True, coverage=87, project=project, issue=issue)


@server.tool()
def flaky(key: str) -> dict[str, int]:
    """Fail the first call for a key, then answer."""
    path = _counter(key)
    count = int(path.read_text()) + 1 if path.exists() else 1
    path.write_text(str(count))
    if count == 1:
        raise ToolError(f"the first call for {key} fails")
    return {"calls": count}


@server.tool()
def slow(seconds: float) -> dict[str, float]:
    """Answer after `seconds`."""
    time.sleep(seconds)
    return {"slept": seconds}


@server.tool(structured_output=False)
def says_yes() -> str:
    """A result whose `passed` is a string."""
    return '{"passed": "yes"}'


@server.tool(structured_output=False)
def echo(text: str) -> str:
    """The text, as it is."""
    return text


@server.tool()
def calls(key: str) -> dict[str, int]:
    """How many times `flaky` was called for the key."""
    path = _counter(key)
    return {"calls": int(path.read_text()) if path.exists() else 0}


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--http", type=int, default=None, help="serve streamable HTTP on PORT")
    given = parser.parse_args()
    if given.http is None:
        server.run("stdio")
    else:
        import uvicorn

        app = server.streamable_http_app(streamable_http_path="/mcp", host="127.0.0.1")
        uvicorn.run(app, host="127.0.0.1", port=given.http, log_level="warning")
