"""The Model Context Protocol doors: `mcp operator`, a server an operator's assistant (Claude
Code, Codex CLI, Cursor …) connects to, to watch and steer machines as the identity of a
dashboard token. The `mcp` package is imported only when the command runs, so the rest of the
command line starts as fast without it."""

from __future__ import annotations

import os
from pathlib import Path

import click

from fsm_celery.cli.common import bounded, client

TOKEN_ENV = "FSM_MCP_TOKEN"
AGENT_PORT = 8766


@click.group("mcp")
def mcp() -> None:
    """Model Context Protocol servers (needs the `mcp` extra: pip install 'fsm-celery[mcp]')."""


@mcp.command("operator")
@click.option(
    "--token-file",
    type=click.Path(dir_okay=False, exists=True, path_type=Path),
    help=f"The file holding the token to act as (stdio; default: ${TOKEN_ENV}).",
)
@click.option("--http", is_flag=True, help="Serve streamable HTTP at /mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --http.")
@bounded("--port", 1, 65535, 8765, "With --http.")
def operator(token_file: Path | None, http: bool, host: str, port: int) -> None:
    """An MCP server for operators: list, status, history, tree; start, pause, resume, cancel;
    approve and reject; send events; rewind, fork, replay.

    Over stdio it acts as one identity: the dashboard token in $FSM_MCP_TOKEN or --token-file
    (an admin's, a viewer's or an approver's; a viewer's gets the read tools only). Over HTTP
    each request acts as its own `Authorization: Bearer` token, the dashboard's tokens."""
    try:
        from fsm_celery.mcp import serve
    except ImportError as exc:
        raise click.ClickException(
            f"the MCP door needs the mcp package ({exc}): pip install 'fsm-celery[mcp]'"
        ) from exc
    from fsm_celery.client.identities import Identities

    fsm = client()
    identities = Identities(fsm.engine.settings)
    if http:
        serve.serve_http(fsm, identities, host, port)
        return
    token = _token(token_file)
    known = identities.identify(token)
    if known is None:
        raise click.UsageError(
            "the token is none of the settings' (FSM_ADMIN_TOKEN, FSM_VIEWER_TOKEN, FSM_APPROVERS)"
        )
    serve.serve_stdio(fsm, known)


@mcp.command("agent")
@click.option("--agent-type", required=True, help="The agent type it serves (cto, ...).")
@click.option("--agent-id", default=None, help="Default: the one its credentials were issued to.")
@click.option("--http", is_flag=True, help="Serve streamable HTTP at /mcp instead of stdio.")
@click.option("--host", default="127.0.0.1", show_default=True, help="With --http.")
@bounded("--port", 1, 65535, AGENT_PORT, "With --http.")
def agent(agent_type: str, agent_id: str | None, http: bool, host: str, port: int) -> None:
    """An MCP server for a coding agent: it is an agent of AGENT_TYPE (concurrency 1), whose
    tasks the coding agent takes and answers with next_task, heartbeat, submit, fail and
    hand_back.

    It connects with FSM_REDIS_URL, the agent's own as `fsm-celery agents credentials` prints
    it. Over HTTP every request carries `Authorization: Bearer <that URL's password>`. With
    FSM_DATABASE_URL set it also serves the held task's machine's history and its state's
    definition as resources."""
    try:
        from fsm_celery.mcp import agent as door
    except ImportError as exc:
        raise click.ClickException(
            f"the MCP door needs the mcp package ({exc}): pip install 'fsm-celery[mcp]'"
        ) from exc
    from fsm_celery.agent.sdk import Agent
    from fsm_celery.config import Settings
    from fsm_celery.mcp.machine import MachineReads

    try:
        served = Agent(agent_type, agent_id=agent_id, concurrency=1, shutdown_grace=0)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if http and not door.password_of(served.redis_url):
        raise click.UsageError(
            "over HTTP the door needs the agent's own credentials: FSM_REDIS_URL as "
            "`fsm-celery agents credentials` prints it (its password is the bearer token)"
        )
    machines = MachineReads.of(Settings())
    door.serve(served, http=(host, port) if http else None, machines=machines)


def _token(token_file: Path | None) -> str:
    if token_file is not None:
        token = token_file.read_text().strip()
        source = str(token_file)
    else:
        token = os.environ.get(TOKEN_ENV, "").strip()
        source = f"${TOKEN_ENV}"
    if not token:
        raise click.UsageError(f"no token to act as: {source} is empty (or use --http)")
    return token


COMMANDS = [mcp]
