"""The command line's agents: those that reported and their Redis credentials (`agents list`,
`credentials`, `revoke`), running one (`agent`: the mock agents, or yours), and the JSON Schemas
of the messages they read and write (`schema`)."""

from __future__ import annotations

import logging
import uuid
from typing import Any

import click

from fsm_celery import views
from fsm_celery.cli.common import (
    Duration,
    actor_option,
    audited,
    bounded,
    client,
    json_option,
    refused,
    show,
)
from fsm_celery.config import get_settings
from fsm_celery.processes import record

Specs = tuple[str, ...]  # an option's values, given once each


@click.group(invoke_without_command=True)
@click.pass_context
def agents(ctx: click.Context) -> None:
    """Agents: those that reported (the default), and their Redis credentials."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(agents_list)


@agents.command("list")
@json_option()
def agents_list(as_json: bool = False) -> None:
    """Agents that reported to the engine, and when they were last seen."""
    show(client().agents(), as_json, views.agents)


@agents.command("credentials")
@click.argument("agent_id", type=click.UUID)
@click.option("--type", "agent_type", required=True, help="The agent type it serves (cto, ...).")
@click.option(
    "--apply",
    is_flag=True,
    help="Create the Redis user now, through FSM_REDIS_URL (which needs ACL rights).",
)
@actor_option()
def agents_credentials(agent_id: uuid.UUID, agent_type: str, apply: bool, actor: str) -> None:
    """Issue the agent its own Redis user: it may read only its tasks and write only its acks.

    Prints the ACL rule (for redis-cli or an ACL file) and the URL the agent connects with, and
    registers the agent's type, so that it cannot claim another. Run it again to change the
    password. See docs/protocol.md, "Identity".
    """
    from fsm_celery.channel import acl

    settings = get_settings()
    prefix = settings.channel_prefix
    password = acl.new_password()
    with refused(click.BadParameter):
        database = acl.database_of(settings.redis_url)
        shown = acl.agent_acl_rules(agent_id, agent_type, prefix, password, database=database)
        line = acl.acl_setuser_command(agent_id, shown)
        file_line = acl.acl_file_line(agent_id, shown)
    if apply:
        from fsm_celery.channel.redis import connect

        rules = acl.create_agent_user(
            connect(settings.redis_url), agent_id, agent_type, prefix, password
        )
        # kept: the bridge restores it
        client().register_agent(agent_id, agent_type, rules, actor=actor)
    else:
        client().register_agent(agent_id, agent_type)
    user = acl.agent_username(agent_id)
    click.echo(f"# Redis user {user} ({'created' if apply else 'not created yet: run this'}):")
    click.echo(line)
    click.echo("# or, in an ACL file:")
    click.echo(file_line)
    click.echo("# the agent connects with (keep it secret; shown once):")
    click.echo(_agent_url(settings.redis_url, user, password))


@agents.command("revoke")
@click.argument("agent_id", type=click.UUID)
@audited("Why; kept in the agent's audit.")
def agents_revoke(agent_id: uuid.UUID, reason: str, actor: str) -> None:
    """Revoke the agent's Redis credentials: its user deleted (its open connections closed,
    its URL refused from then on), never created again by the bridge, no machine assigned to
    it; audited. Issue new ones with `agents credentials`."""
    existed = client().revoke_agent(agent_id, actor, reason)
    user = "deleted" if existed else "already absent"
    click.echo(f"revoked {agent_id}: Redis user {user}; recorded as revoked by {actor}")


def _agent_url(redis_url: str, user: str, password: str) -> str:
    """The deployment's Redis URL with the agent's credentials instead of the engine's."""
    from urllib.parse import quote, urlsplit, urlunsplit

    from fsm_celery.redis_address import is_sentinel

    parts = urlsplit(redis_url)
    if is_sentinel(redis_url):  # the same sentinels: the agent follows the failovers too
        where = parts.netloc.rpartition("@")[2]
    else:
        host = parts.hostname or "127.0.0.1"
        where = f"{host}:{parts.port}" if parts.port else host
    netloc = f"{quote(user, safe='')}:{quote(password, safe='')}@{where}"
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))


@click.command()
@click.option("--mock", is_flag=True, help="Serve every shipped definition with scripted outputs.")
@click.option(
    "--llm",
    is_flag=True,
    help="Answer with a chat model (FSM_LLM_BASE_URL, FSM_LLM_MODEL): no code needed.",
)
@click.option(
    "--app",
    "app_path",
    default=None,
    help="module:attribute of your fsm_celery Agent, or of a list of them.",
)
@click.option(
    "--agent-type",
    "agent_types",
    multiple=True,
    help="Agent types to serve (default with --mock: every type in the definitions).",
)
@click.option("--agent-id", type=click.UUID, default=None, help="Stable id (one agent type).")
@bounded("--concurrency", 1, None, 4)
@click.option("--seed", type=int, default=0, show_default=True)
@click.option(
    "--fail",
    "fails",
    multiple=True,
    metavar="STATE[:N,M]",
    help="Fail the state (on visits N, M; every visit without them).",
)
@click.option("--slow", "slows", multiple=True, metavar="STATE=DURATION")
@click.option("--silent", "silents", multiple=True, metavar="STATE", help="Never answer it.")
@click.option(
    "--think",
    type=Duration("seconds", 1, 86_400),
    default=0.0,
    help="Up to this long per task (seconds, or 30s, 2m).",
)
def agent(
    mock: bool,
    llm: bool,
    app_path: str | None,
    agent_types: tuple[str, ...],
    agent_id: uuid.UUID | None,
    concurrency: int,
    seed: int,
    fails: Specs,
    slows: Specs,
    silents: Specs,
    think: float,
) -> None:
    """Run an agent: the mock agents (--mock), a chat model (--llm), or your own (--app
    module:attribute)."""
    from fsm_celery.agent.runner import run_agents, user_agents

    settings = get_settings()
    logging.getLogger("fsm_celery").setLevel(logging.INFO)
    record(settings.state_directory, "agent")
    if app_path is not None:
        with refused():
            found = user_agents(app_path)
        run_agents(found)
        return
    if mock and llm:
        raise click.UsageError("pass --mock or --llm, not both")
    if llm:
        from fsm_celery.agent.runner import llm_agents

        with refused():
            found = llm_agents(settings, agent_types, agent_id, concurrency)
        run_agents(found)
        return
    if not mock:
        raise click.UsageError("pass --mock, --llm, or --app module:attribute naming your Agent")
    from fsm_celery.agent.runner import mock_agents

    with refused():
        script = _mock_script(seed, fails, slows, silents, think)
        found = mock_agents(settings, script, agent_types, agent_id, concurrency)
    run_agents(found)


def _mock_script(seed: int, fails: Specs, slows: Specs, silents: Specs, think: float) -> Any:
    from fsm_celery.agent.mock import MockScript

    failures: dict[str, frozenset[int]] = {}
    for spec in fails:
        state, _, visits = spec.partition(":")
        failures[state] = frozenset(int(v) for v in visits.split(",") if v)
    slow: dict[str, float] = {}
    for spec in slows:
        state, sep, seconds = spec.partition("=")
        if not sep:
            raise ValueError(f"--slow takes STATE=SECONDS, got {spec!r}")
        slow[state] = Duration("seconds", 1, 86_400).convert(seconds, None, None)
    return MockScript(
        seed=seed, failures=failures, slow=slow, silent=frozenset(silents), think=(0.0, think)
    )


@click.command()
def schema() -> None:
    """Print the JSON Schemas of the wire messages."""
    from fsm_celery.core.messages import schemas_json

    click.echo(schemas_json())


COMMANDS = (agents, agent, schema)
