"""`fsm-celery definitions`: check the YAML definitions (`validate`, and `check` one against the
machines that ended), and store them as versions (`load`)."""

from __future__ import annotations

import sys

import click

from fsm_celery import views
from fsm_celery.cli.common import client, json_option, show
from fsm_celery.config import get_settings
from fsm_celery.core.replay import Outcome
from fsm_celery.exits import Exit
from fsm_celery.terminal import safe


@click.group()
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


@definitions.command("check")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--replay-last",
    "count",
    type=click.IntRange(min=0, max=10_000),
    default=0,
    help="Replay the last N ended machines of its type against it.",
)
@json_option()
def definitions_check(path: str, count: int, as_json: bool) -> None:
    """Check a definition file before it is loaded: its problems, and with --replay-last N
    what it would do to the last N machines of its type that ended (the same path, or where
    and why they diverge). Exit status 1 when one diverges, 3 when the file is invalid."""
    from fsm_celery.core.loader import load_file

    definition = load_file(path)  # DefinitionError: every problem, exit 3
    if not count:
        click.echo(f"ok  {definition.type}  ({len(definition.states)} states)")
        return
    found = client().replay_last(definition, count)
    show(
        found,
        as_json,
        lambda found: views.replays(found, path, definition.type),
        lambda found: [f.to_dict() for f in found],
    )
    if any(f.replay.outcome is Outcome.DIVERGED for f in found):
        sys.exit(Exit.FAILED)


@definitions.command("load")
@click.argument("path", required=False)
def definitions_load(path: str | None) -> None:
    """Store the definitions at PATH as new versions where they changed."""
    for machine_type, version, created in client().load_definitions(path):
        click.echo(f"{'new ' if created else 'same'}  {machine_type}  v{version}")


COMMANDS = (definitions,)
