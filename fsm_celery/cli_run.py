"""Running a deployment: `fsm-celery dev` (PostgreSQL and Redis for development, in a folder,
as the current user) and `fsm-celery stop` (this deployment's processes stopped by their own
records, fsm_celery.processes, never another deployment's)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from subprocess import Popen
from typing import Any

import click

from fsm_celery import devstack, processes
from fsm_celery.config import get_settings
from fsm_celery.exceptions import DevStackError
from fsm_celery.exits import Exit
from fsm_celery.terminal import safe


@click.command("stop")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    help="Seconds to wait for them to exit (a worker finishes its tasks first).",
)
@click.option("--kill", is_flag=True, help="SIGKILL the ones still running after --timeout.")
@click.option("--list", "only_list", is_flag=True, help="List them; stop nothing.")
def stop(timeout: float, kill: bool, only_list: bool) -> None:
    """Stop this deployment's workers, beat, ack bridges, agents and dashboards: the ones
    recorded in its state directory (FSM_STATE_DIR), started with these FSM_* settings."""
    directory = get_settings().state_directory
    found = processes.running(directory)
    if not found:
        click.echo(f"nothing of this deployment runs (no process recorded in {directory})")
        return
    for record in found:
        click.echo(f"{'running' if only_list else 'stopping'} {safe(record.line)}")
    if only_list:
        return
    left = processes.stop(found, timeout, kill)
    for record in left:
        click.echo(f"still running after {timeout:g} s: {safe(record.line)}", err=True)
    if left:
        sys.exit(Exit.FAILED)
    click.echo(f"stopped {len(found)}")


@click.command("dev")
@click.argument(
    "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("fsm-dev")
)
@click.option(
    "--pg-port", type=click.IntRange(1, 65535), default=devstack.PG_PORT, show_default=True
)
@click.option(
    "--redis-port", type=click.IntRange(1, 65535), default=devstack.REDIS_PORT, show_default=True
)
def dev(directory: Path, pg_port: int, redis_port: int) -> None:
    """Run a PostgreSQL and a Redis for development in DIRECTORY (made the first time), as the
    current user: no sudo, no system service. Prints the FSM_* settings to use (kept in
    DIRECTORY/env); Ctrl-C or SIGTERM stops both (exit 0 once both stopped), their data stays."""
    # Before anything starts, so a stop asked for while they start stops them all the same. The
    # handlers only note the request, which the loops below look at: an exception raised from
    # a handler would land wherever the program happens to be (between the last line printed
    # and the waiting loop, inside Popen.poll), and escape as click's "Aborted!", exit 1.
    _STOPS.clear()
    signal.signal(signal.SIGTERM, _note_stop)
    signal.signal(signal.SIGINT, _note_stop)
    stack = devstack.Stack(directory.resolve(), pg_port, redis_port)
    started = devstack.start(stack, _stop_asked)
    try:
        if not _stop_asked():
            env = devstack.write_env(stack)
            click.echo(
                f"PostgreSQL on {devstack.HOST}:{pg_port}, Redis on {devstack.HOST}:{redis_port}"
            )
            click.echo(f"the settings, kept in {env} (in another shell: . {env}):")
            click.echo(env.read_text().rstrip("\n"))
            click.echo(
                "then: fsm-celery db upgrade && fsm-celery definitions load; Ctrl-C stops them"
            )
            _serve(started)
        click.echo(f"{signal.Signals(_STOPS[0]).name}: stopping PostgreSQL and Redis")
    except BaseException:
        for problem in devstack.stop(started):
            click.echo(f"error: {problem}", err=True)
        raise
    problems = devstack.stop(started)
    if problems:
        raise DevStackError("stop", "; ".join(problems))
    click.echo("stopped PostgreSQL and Redis")


_STOPS: list[int] = []  # the signals asking `dev` to stop, as they came


def _note_stop(signum: int, _frame: Any) -> None:
    _STOPS.append(signum)


def _stop_asked() -> bool:
    return bool(_STOPS)


def _serve(started: list[Popen[bytes]]) -> None:
    """Until SIGINT or SIGTERM, or a server exits (then fail, naming it)."""
    while not _stop_asked():
        gone = next((p for p in started if p.poll() is not None), None)
        if gone is not None:
            what = "PostgreSQL" if gone is started[0] else "Redis"
            raise DevStackError(what, f"exited with {gone.returncode} (its log is in its folder)")
        time.sleep(0.2)
