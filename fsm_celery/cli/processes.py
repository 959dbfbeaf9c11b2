"""Running a deployment's processes: `ack-bridge` and `dashboard` (the agents' own is in
cli/agents.py, the worker and beat are Celery's), `demo` (all of it in one process), `dev`
(PostgreSQL and Redis for development, in a folder, as the current user) and `stop` (this
deployment's processes stopped by their own records, fsm_celery.processes, never another
deployment's)."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path
from subprocess import Popen
from typing import Any

import click

from fsm_celery import devstack, processes
from fsm_celery.cli.common import bounded
from fsm_celery.config import get_settings
from fsm_celery.exceptions import CannotListen, DevStackError
from fsm_celery.exits import Exit
from fsm_celery.processes import record
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
    for process in found:
        click.echo(f"{'running' if only_list else 'stopping'} {safe(process.line)}")
    if only_list:
        return
    left = processes.stop(found, timeout, kill)
    for process in left:
        click.echo(f"still running after {timeout:g} s: {safe(process.line)}", err=True)
    if left:
        sys.exit(Exit.FAILED)
    click.echo(f"stopped {len(found)}")


@click.command("dev")
@click.argument(
    "directory", type=click.Path(file_okay=False, path_type=Path), default=Path("fsm-dev")
)
@bounded("--pg-port", 1, 65535, devstack.PG_PORT)
@bounded("--redis-port", 1, 65535, devstack.REDIS_PORT)
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


@click.command("ack-bridge")
@bounded(
    "--processes",
    1,
    None,
    1,
    about="Processes sharing the ack stream (one per core); the first also reads pub/sub.",
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


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="The address to listen on.")
@bounded("--port", 1, 65535, 8000)
@bounded(
    "--workers",
    1,
    64,
    1,
    about="Server processes (each holds one subscription to the live feed).",
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


@click.command()
@click.option("--definitions", "path", default=None, help="Definitions folder to run.")
def demo(path: str | None) -> None:
    """Run machines end to end on SQLite with in-process workers and mock agents."""
    from fsm_celery.demo import run_demo

    if not run_demo(path or get_settings().definitions):
        sys.exit(1)


COMMANDS = (ack_bridge, dashboard, demo, dev, stop)
