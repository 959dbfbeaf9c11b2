"""The fsm-celery command line."""

from __future__ import annotations

import logging
import os
import sys
import uuid
from dataclasses import asdict
from pathlib import Path
from typing import Any

import click

from fsm_celery import cli_gates, cli_history, cli_run, views
from fsm_celery.cli_common import Duration
from fsm_celery.cli_common import actor as _actor
from fsm_celery.cli_common import actor_option as _actor_option
from fsm_celery.cli_common import client as _client
from fsm_celery.cli_common import echo_json as _echo_json
from fsm_celery.cli_common import echo_lines as _echo_lines
from fsm_celery.cli_common import json_object as _json_object
from fsm_celery.client import TREE_MOST, TREE_SHOWN
from fsm_celery.config import get_settings
from fsm_celery.engine.schedules import ScheduleInfo
from fsm_celery.exceptions import CannotListen
from fsm_celery.exits import EPILOG, Exit, FailCleanly
from fsm_celery.processes import record
from fsm_celery.terminal import safe, table

BIGINT_MAX = 2**63 - 1


@click.group(cls=FailCleanly, epilog=EPILOG)
@click.version_option(package_name="fsm-celery", prog_name="fsm-celery")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level; tracebacks on errors.")
def main(verbose: bool) -> None:
    """Durable, declarative state machines that drive AI agents.

    A MACHINE_ID is a machine's id or the start of it (4 hex digits or more, as the dashboard's
    8), as git takes a commit's.
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


@main.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@click.option(
    "--create",
    is_flag=True,
    help="Create the database first when it does not exist (CREATE DATABASE, through the "
    "server's postgres database: the user needs the CREATEDB privilege).",
)
def db_upgrade(revision: str, create: bool) -> None:
    """Create or migrate the schema."""
    from sqlalchemy.engine import make_url

    from fsm_celery.store.db import connect, create_database, upgrade

    url = get_settings().database_url
    if create and create_database(url):
        click.echo(f"created database {make_url(url).database}")
    upgrade(connect(url), revision)
    click.echo(f"database at {revision}")


@main.group()
def definitions() -> None:
    """Machine definitions (YAML)."""


@definitions.command("validate")
@click.argument("path", required=False)
def definitions_validate(path: str | None) -> None:
    """Check the definitions at PATH (file or folder; default FSM_DEFINITIONS_PATH)."""
    from fsm_celery.core.loader import definition_files, load_all
    from fsm_celery.exceptions import DefinitionError

    try:
        loaded = load_all(definition_files(path or get_settings().definitions))
    except DefinitionError as exc:
        for problem in exc.problems:
            click.echo(safe(problem), err=True)
        sys.exit(Exit.CONFIG)
    for d in loaded:
        click.echo(f"ok  {d.type}  ({len(d.states)} states, agent {d.agent_type})")


definitions.add_command(cli_gates.definitions_check)


@definitions.command("load")
@click.argument("path", required=False)
def definitions_load(path: str | None) -> None:
    """Store the definitions at PATH as new versions where they changed."""
    for machine_type, version, created in _client().load_definitions(path):
        click.echo(f"{'new ' if created else 'same'}  {machine_type}  v{version}")


@main.command()
@click.argument("machine_type")
@click.option("--context", default="{}", callback=_json_object, help="Initial context (JSON).")
@click.option("--agent-id", type=click.UUID, default=None, help="UUID of the agent that serves it.")
@click.option("--github-issue", type=int, default=None)
def start(
    machine_type: str, context: dict[str, Any], agent_id: uuid.UUID | None, github_issue: int | None
) -> None:
    """Start a machine of MACHINE_TYPE and print its id."""
    click.echo(_client().start_machine(machine_type, context, agent_id, github_issue))


@main.command()
@click.argument("machine_id")
@click.option("--json", "as_json", is_flag=True)
def status(machine_id: str, as_json: bool) -> None:
    """Show a machine (MACHINE_ID: its id, or the start of it)."""
    info = _client().get_machine(machine_id)
    if as_json:
        _echo_json(info.to_dict())
        return
    _echo_lines(views.machine(info))


main.add_command(cli_history.history)
main.add_command(cli_run.stop)
main.add_command(cli_run.dev)


@main.command()
@click.argument("machine_id")
@click.option("--step", type=click.IntRange(min=0), default=None, help="After this step.")
def context(machine_id: str, step: int | None) -> None:
    """Print a machine's context (JSON) as it was after a step, or as it is: reconstructed from
    what each step of its history changed."""
    _echo_json(_client().context_at(machine_id, step))


@main.command()
@click.argument("machine_id")
@click.option(
    "--shown",
    type=click.IntRange(min=0, max=100),
    default=TREE_SHOWN,
    show_default=True,
    help="Children listed under each machine; the others are counted by status.",
)
@click.option(
    "--most",
    type=click.IntRange(min=1, max=1000),
    default=TREE_MOST,
    show_default=True,
    help="Machines listed in all.",
)
@click.option("--json", "as_json", is_flag=True)
def tree(machine_id: str, shown: int, most: int, as_json: bool) -> None:
    """Show a machine and the children its fan-outs started, down the tree: each with its
    type, state and status."""
    found = _client().tree(machine_id, shown, most)
    if as_json:
        _echo_json(found.to_dict())
        return
    _echo_lines(views.tree(found))


def _known_machine_type(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    """A --type filter, refused (as the HTTP API does) unless a definition has the type (a
    child's type, `TYPE.STATE[.branch]`, is named by its place in its root's)."""
    if value is not None and value.split(".")[0] not in (known := _client().machine_types()):
        raise click.BadParameter(f"unknown machine type {value!r}: one of {', '.join(known)}")
    return value


def _known_agent_type(
    _ctx: click.Context, _param: click.Parameter, value: str | None
) -> str | None:
    """An --agent-type filter, refused unless a definition names the agent type."""
    if value is not None and value not in (known := _client().agent_types()):
        raise click.BadParameter(f"unknown agent type {value!r}: one of {', '.join(known)}")
    return value


@main.command("list")
@click.option("--agent-type", callback=_known_agent_type)
@click.option("--status", type=click.Choice(views.STATUSES))
@click.option("--type", "machine_type", callback=_known_machine_type)
@click.option("--parent", metavar="MACHINE_ID", help="The children of this machine.")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def list_(
    agent_type: str | None,
    status: str | None,
    machine_type: str | None,
    parent: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List machines, newest first."""
    found = _client().list_machines(
        agent_type=agent_type,
        status=status,
        machine_type=machine_type,
        parent=parent,
        limit=limit,
    )
    if as_json:
        _echo_json([m.to_dict() for m in found])
        return
    _echo_lines(views.machines(found))


def _admin_command(action: str, doc: str, needs_target: bool = False) -> None:
    params: list[click.Parameter] = [click.Argument(["machine_id"])]
    if needs_target:
        params.append(click.Argument(["target"]))
    params += [
        click.Option(["--reason"], default="", help="Why; kept in the history."),
        click.Option(
            ["--actor"],
            default=lambda: os.environ.get("USER", "cli"),
            show_default="$USER",
            callback=_actor,
        ),
    ]

    def callback(machine_id: str, reason: str, actor: str, target: str | None = None) -> None:
        client = _client()
        if target is not None:
            info = client.force(machine_id, target, actor, reason)
        else:
            info = getattr(client, action)(machine_id, actor, reason)
        click.echo(f"{info.id}  {info.status}  {info.current_state}")

    main.add_command(click.Command(action, callback=callback, params=params, help=doc))


_admin_command("pause", "Pause a running machine (acks for it are then refused).")
_admin_command("resume", "Resume a paused machine: its current state is entered again.")
_admin_command("cancel", "Cancel a running or paused machine.")
_admin_command("retry", "Enter the current state again (a failed machine: where it failed).")
_admin_command("force", "Move a machine to TARGET state, whatever its status.", needs_target=True)
for _gate_command in cli_gates.COMMANDS:
    main.add_command(_gate_command)


@main.command()
@click.argument("machine_id")
@click.option(
    "--tokens", type=click.IntRange(min=0, max=BIGINT_MAX), default=None, help="Token budget."
)
@click.option("--cost", type=click.FloatRange(min=0, max=1e15), default=None, help="Cost budget.")
@click.option("--reason", default="", help="Why; kept with the change.")
@_actor_option()
def budget(
    machine_id: str, tokens: int | None, cost: float | None, reason: str, actor: str
) -> None:
    """Set a machine's budget (unset: no limit); one paused over budget resumes within it."""
    info = _client().set_budget(machine_id, actor, tokens=tokens, cost=cost, reason=reason)
    click.echo(
        f"{info.id}  {info.status}  tokens {info.tokens_used}/{info.budget_tokens or '-'}"
        f"  cost {info.cost:g}/{info.budget_cost if info.budget_cost is not None else '-'}"
    )


@main.group(invoke_without_command=True)
@click.pass_context
def agents(ctx: click.Context) -> None:
    """Agents: those that reported (the default), and their Redis credentials."""
    if ctx.invoked_subcommand is None:
        ctx.invoke(agents_list)


@agents.command("list")
@click.option("--json", "as_json", is_flag=True)
def agents_list(as_json: bool = False) -> None:
    """Agents that reported to the engine, and when they were last seen."""
    found = _client().agents()
    if as_json:
        _echo_json(found)
        return
    _echo_lines(views.agents(found))


@agents.command("credentials")
@click.argument("agent_id", type=click.UUID)
@click.option("--type", "agent_type", required=True, help="The agent type it serves (cto, ...).")
@click.option(
    "--apply",
    is_flag=True,
    help="Create the Redis user now, through FSM_REDIS_URL (which needs ACL rights).",
)
@_actor_option()
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
    try:
        database = acl.database_of(settings.redis_url)
        line = acl.acl_setuser_command(agent_id, agent_type, prefix, password, database=database)
        file_line = acl.acl_file_line(agent_id, agent_type, prefix, password, database=database)
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc
    if apply:
        from fsm_celery.channel.redis import connect

        rules = acl.create_agent_user(
            connect(settings.redis_url), agent_id, agent_type, prefix, password
        )
        # kept: the bridge restores it
        _client().register_agent(agent_id, agent_type, rules, actor=actor)
    else:
        _client().register_agent(agent_id, agent_type)
    user = acl.agent_username(agent_id)
    click.echo(f"# Redis user {user} ({'created' if apply else 'not created yet: run this'}):")
    click.echo(line)
    click.echo("# or, in an ACL file:")
    click.echo(file_line)
    click.echo("# the agent connects with (keep it secret; shown once):")
    click.echo(_agent_url(settings.redis_url, user, password))


@agents.command("revoke")
@click.argument("agent_id", type=click.UUID)
@click.option("--reason", default="", help="Why; kept in the agent's audit.")
@_actor_option()
def agents_revoke(agent_id: uuid.UUID, reason: str, actor: str) -> None:
    """Revoke the agent's Redis credentials: its user deleted (its open connections closed,
    its URL refused from then on), never created again by the bridge, no machine assigned to
    it; audited. Issue new ones with `agents credentials`."""
    existed = _client().revoke_agent(agent_id, actor, reason)
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


@main.command()
@click.option("--mock", is_flag=True, help="Serve every shipped definition with scripted outputs.")
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
@click.option("--concurrency", type=click.IntRange(min=1), default=4, show_default=True)
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
    app_path: str | None,
    agent_types: tuple[str, ...],
    agent_id: uuid.UUID | None,
    concurrency: int,
    seed: int,
    fails: tuple[str, ...],
    slows: tuple[str, ...],
    silents: tuple[str, ...],
    think: float,
) -> None:
    """Run an agent: the mock agents (--mock), or your own (--app module:attribute)."""
    from fsm_celery.agent.runner import run_agents, user_agents

    settings = get_settings()
    logging.getLogger("fsm_celery").setLevel(logging.INFO)
    record(settings.state_directory, "agent")
    if app_path is not None:
        try:
            found = user_agents(app_path)
        except ValueError as exc:
            raise click.UsageError(str(exc)) from exc
        run_agents(found)
        return
    if not mock:
        raise click.UsageError("pass --mock, or --app module:attribute naming your Agent")
    from fsm_celery.agent.runner import mock_agents

    try:
        script = _mock_script(seed, fails, slows, silents, think)
        agents = mock_agents(settings, script, agent_types, agent_id, concurrency)
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    run_agents(agents)


def _mock_script(
    seed: int,
    fails: tuple[str, ...],
    slows: tuple[str, ...],
    silents: tuple[str, ...],
    think: float,
) -> Any:
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


@main.command()
@click.option("--json", "as_json", is_flag=True, help="Everything, durations in milliseconds.")
def stats(as_json: bool) -> None:
    """Machines per type and status; attempts, durations and success per state; usage;
    rejected messages per reason."""
    found = _client().stats()
    if as_json:
        _echo_json(found)
        return
    _echo_lines(views.stats(found))


@main.command()
@click.option("--machine-id")
@click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True)
@click.option("--parked", is_flag=True, help="Messages parked in the dead-letter stream instead.")
@click.option("--json", "as_json", is_flag=True)
def rejected(machine_id: str | None, limit: int, parked: bool, as_json: bool) -> None:
    """List rejected messages, newest first (--parked: those the bridge could not even record)."""
    if parked:
        dead = _client().parked(limit)
        if as_json:
            _echo_json(dead)
        else:
            _echo_lines(views.parked(dead))
        return
    found = _client().rejected(machine_id, limit)
    if as_json:
        _echo_json(found)
        return
    _echo_lines(views.rejected(found))


@main.group(invoke_without_command=True)
@click.pass_context
def schedules(ctx: click.Context) -> None:
    """Schedules: machines beat starts on cron ticks (list by default; pause, resume, trigger).

    A schedule is named TYPE/NAME (TYPE alone when the type has one). Changes are stored in the
    database, take effect at once on every beat, and are audited (`schedules show`).
    """
    if ctx.invoked_subcommand is None:
        ctx.invoke(schedules_list)


@schedules.command("list")
@click.option("--json", "as_json", is_flag=True)
def schedules_list(as_json: bool) -> None:
    """Every schedule: its cron, state, next tick and latest run."""
    infos = _client().schedules()
    if as_json:
        _echo_json([{"schedule": i.key, **asdict(i)} for i in infos])
        return
    _echo_lines(table(SCHEDULE_HEADER, [_schedule_line(i) for i in infos]))


SCHEDULE_HEADER = ["SCHEDULE", "CRON", "TIMEZONE", "OVERLAP", "STATE", "NEXT RUN", "LAST RUN"]


def _schedule_line(info: ScheduleInfo) -> list[str]:
    state = "retired" if info.removed else "paused" if info.paused else "active"
    last = "-"
    if info.last_run_at is not None:
        last = f"{info.last_outcome} {info.last_run_at:%Y-%m-%d %H:%M:%S}"
    next_run = f"{info.next_run_at:%Y-%m-%d %H:%M:%S}"
    return [info.key, info.cron, info.timezone, info.overlap, state, next_run, last]


@schedules.command("show")
@click.argument("schedule")
@click.option("--limit", type=click.IntRange(min=1, max=1000), default=20, show_default=True)
def schedules_show(schedule: str, limit: int) -> None:
    """A schedule's latest runs and the changes made to it (who, when, why)."""
    client = _client()
    _echo_lines(table(SCHEDULE_HEADER, [_schedule_line(client.schedule(schedule))]))
    runs, events = client.schedule_history(schedule, limit)
    for r in runs:
        by = f"  by {r['actor']}" if r["actor"] else ""
        line = f"run    {r['tick_at']}  {r['outcome']:8} {r['machine_id'] or '-'}"
        click.echo(safe(f"{line}{by}  {r['detail'] or ''}".rstrip()))
    for e in events:
        why = f"  ({e['reason']})" if e["reason"] else ""
        click.echo(safe(f"change {e['created_at']}  {e['action']:8} by {e['actor']}{why}"))


def _schedule_command(action: str, doc: str) -> None:
    @schedules.command(action, help=doc)
    @click.argument("schedule")
    @click.option("--reason", default="", help="Why; kept in the schedule's audit.")
    @_actor_option()
    def command(schedule: str, reason: str, actor: str) -> None:
        client = _client()
        if action == "trigger":
            click.echo(client.trigger_schedule(schedule, actor, reason))
            return
        info = getattr(client, f"{action}_schedule")(schedule, actor, reason)
        click.echo(f"{info.key}  {'paused' if info.paused else 'active'}")


_schedule_command("pause", "Start no machine on the schedule's ticks until it is resumed.")
_schedule_command("resume", "Start machines on the schedule's ticks again, from the next on.")
_schedule_command("trigger", "Start the schedule's machine now (whatever its overlap); print it.")


@main.command()
def doctor() -> None:
    """Check the deployment: database and migrations, Redis, definitions, workers, beat,
    bridges, token secret; one line each, with the fix. Exit status 1 when any fails."""
    from fsm_celery.doctor import run

    if not run(get_settings(), click.echo):
        sys.exit(1)


@main.command()
def schema() -> None:
    """Print the JSON Schemas of the wire messages."""
    from fsm_celery.core.messages import schemas_json

    click.echo(schemas_json())


@main.command()
@click.option("--definitions", "path", default=None, help="Definitions folder to run.")
def demo(path: str | None) -> None:
    """Run machines end to end on SQLite with in-process workers and mock agents."""
    from fsm_celery.demo import run_demo

    if not run_demo(path or get_settings().definitions):
        sys.exit(1)


@main.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite the files init writes.")
def init(directory: Path, force: bool) -> None:
    """Write a starter deployment in DIRECTORY: definitions/ (the shipped ones, to edit) and a
    .env with every main setting, a freshly generated task token secret, the dashboard's
    tokens and Flower's password."""
    import shlex

    from fsm_celery.init import init as write

    for path in write(directory, force):
        click.echo(f"wrote {path}")
    click.echo("next, from that folder (the .env's relative paths are read from it):")
    click.echo(f"  cd {shlex.quote(str(directory))}; set -a; . ./.env; set +a")
    click.echo("  fsm-celery db upgrade --create && fsm-celery definitions load")
    click.echo("  fsm-celery doctor")


@main.command("ack-bridge")
@click.option(
    "--processes",
    type=click.IntRange(min=1),
    default=1,
    show_default=True,
    help="Processes sharing the ack stream (one per core); the first also reads pub/sub.",
)
@click.option(
    "--inline",
    is_flag=True,
    help="Apply the acks here and send the next state_tasks directly (FSM_TRANSITION_MODE="
    "inline): fewer hops, lower latency; by default each batch goes to an fsm.apply_acks "
    "Celery task.",
)
def ack_bridge(processes: int, inline: bool) -> None:
    """Read acks and heartbeats from Redis (streams and pub/sub) and have them applied."""
    from fsm_celery.acks.serve import Plan, run_bridge
    from fsm_celery.config import TransitionMode
    from fsm_celery.wiring import ack_bridge

    settings = get_settings()
    if inline:  # in the settings every part of the bridge's processes reads the mode from
        settings = settings.model_copy(update={"transition_mode": TransitionMode.INLINE})
    settings.require_secret()
    record(settings.state_directory, "ack-bridge")
    run_bridge(processes, Plan(ack_bridge, settings))
    click.echo("ack bridge stopped")


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@click.option("--port", type=click.IntRange(1, 65535), default=8000, show_default=True)
@click.option(
    "--workers",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Server processes (each holds one subscription to the live feed).",
)
def dashboard(host: str, port: int, workers: int) -> None:
    """Serve the HTTP API (/api, /openapi.json), the dashboard's pages and the GitHub webhook.

    Needs FSM_ADMIN_TOKEN and/or FSM_VIEWER_TOKEN (or FSM_PUBLIC_READS); serve it behind TLS
    when it is reached from elsewhere (its session cookie is HTTPS-only; FSM_SECURE_COOKIES=false
    relaxes that for plain HTTP on 127.0.0.1 or localhost only).
    """
    import uvicorn

    from fsm_celery.http import create_app

    create_app()  # refuse bad settings here, in one line, before the server starts
    _check_address(host, port)
    record(get_settings().state_directory, "dashboard")
    uvicorn.run(
        "fsm_celery.http:create_app",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        proxy_headers=True,
        log_level="info",
    )


def _check_address(host: str, port: int) -> None:
    """Refuse, in one line, an address the server could not listen on (uvicorn would log its
    startup and a traceback-like error instead)."""
    import errno
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn chooses it
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
            probe.bind((host, port))
    except socket.gaierror as exc:
        raise CannotListen(host, port, f"--host {host!r}: {exc.strerror}") from exc
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            raise CannotListen.in_use(host, port) from exc
        raise CannotListen(host, port, f"cannot listen on {host}:{port}: {exc.strerror}") from exc
