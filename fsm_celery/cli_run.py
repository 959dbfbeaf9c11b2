"""`fsm-celery stop`: this deployment's processes stopped by their own records
(fsm_celery.processes), never another deployment's."""

from __future__ import annotations

import sys

import click

from fsm_celery import processes
from fsm_celery.config import get_settings
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
