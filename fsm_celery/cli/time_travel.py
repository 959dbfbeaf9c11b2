"""The command line's time travel: `rewind` a machine to an earlier step, `fork` a new one from
it, `replay` its history against a definition."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import click

from fsm_celery import views
from fsm_celery.cli.common import F, audited, client, fields, json_option, options, show
from fsm_celery.core.replay import Outcome
from fsm_celery.exits import Exit


def _at_step(flag: str, why: str) -> Callable[[F], F]:
    """A machine, one of its steps, edits to the context it had then, and who and why."""
    return options(
        click.argument("machine_id"),
        click.option(flag, "step", type=click.IntRange(min=0), required=True, help="The step."),
        click.option("--set", "edits", multiple=True, callback=fields, help="An edit: KEY=VALUE."),
        audited(why),
    )


@click.command("rewind")
@_at_step("--to", "Why; kept in the history.")
def rewind(machine_id: str, step: int, edits: dict[str, Any], reason: str, actor: str) -> None:
    """Put a machine back at the state it was in after a step (`history --context` shows them),
    with the context it had then and the edits over it, as a new attempt."""
    done = client().rewind(machine_id, step, actor, reason, edits)
    info = done.machine
    click.echo(f"{info.id}  {info.status}  {info.current_state}  step {done.step}")


@click.command("fork")
@_at_step("--from", "Why; kept in its history.")
def fork(machine_id: str, step: int, edits: dict[str, Any], reason: str, actor: str) -> None:
    """Start a new machine at the state a machine was in after a step, with the context it had
    then and the edits over it; the source is untouched. Prints the new machine's id."""
    click.echo(client().fork(machine_id, step, actor, reason, edits))


@click.command("replay")
@click.argument("machine_id")
@click.option(
    "--definition",
    "path",
    type=click.Path(exists=True, dir_okay=False),
    help="Replay against this file's definition (not loaded).",
)
@click.option("--version", type=click.IntRange(min=1), help="Against this stored version.")
@json_option()
def replay(machine_id: str, path: str | None, version: int | None, as_json: bool) -> None:
    """Run a machine's recorded history again against a definition (its type's newest by
    default), calling no agent: step by step, whether it takes the same path, and where and
    why it diverges. Exit status 1 when it diverges."""
    if path is not None and version is not None:
        raise click.UsageError("give --definition or --version, not both")
    found = client().replay(machine_id, definition=path, version=version)
    show(found, as_json, views.replay, lambda found: found.to_dict())
    if found.replay.outcome is Outcome.DIVERGED:
        sys.exit(Exit.FAILED)


COMMANDS = (rewind, fork, replay)
