"""The command line's machines: start one, look at them (`status`, `context`, `tree`, `list`),
and act on one (`pause`, `resume`, `cancel`, `retry`, `force`, `budget`)."""

from __future__ import annotations

import uuid
from collections.abc import Callable
from typing import Any

import click

from fsm_celery import views
from fsm_celery.cli.common import (
    audited,
    bounded,
    client,
    echo_json,
    json_object,
    json_option,
    limit_option,
    show,
)
from fsm_celery.client import TREE_MOST, TREE_SHOWN, Client

BIGINT_MAX = 2**63 - 1


@click.command()
@click.argument("machine_type")
@click.option("--context", default="{}", callback=json_object, help="Initial context (JSON).")
@click.option("--agent-id", type=click.UUID, default=None, help="UUID of the agent that serves it.")
@click.option("--github-issue", type=int, default=None)
@click.option(
    "--key",
    default=None,
    help="Idempotency key (1-200 printable characters): started again with it, the same "
    "machine is printed and nothing new starts.",
)
def start(
    machine_type: str,
    context: dict[str, Any],
    agent_id: uuid.UUID | None,
    github_issue: int | None,
    key: str | None,
) -> None:
    """Start a machine of MACHINE_TYPE and print its id; with --key, a start repeated with
    the key prints the machine the first one made, and stderr says which: started or found."""
    started = client().start(machine_type, context, agent_id, github_issue, key)
    click.echo(started.machine_id)
    if key is None:
        return
    if started.found:
        click.echo(f"found: key {key!r} started this machine before; nothing new", err=True)
    else:
        click.echo(f"started: key {key!r} now holds this machine", err=True)


@click.command()
@click.argument("machine_id")
@json_option()
def status(machine_id: str, as_json: bool) -> None:
    """Show a machine (MACHINE_ID: its id, or the start of it)."""
    show(client().get_machine(machine_id), as_json, views.machine, lambda info: info.to_dict())


@click.command()
@click.argument("machine_id")
@click.option("--step", type=click.IntRange(min=0), default=None, help="After this step.")
def context(machine_id: str, step: int | None) -> None:
    """Print a machine's context (JSON) as it was after a step, or as it is: reconstructed from
    what each step of its history changed."""
    echo_json(client().context_at(machine_id, step))


@click.command()
@click.argument("machine_id")
@bounded(
    "--shown",
    0,
    100,
    TREE_SHOWN,
    about="Children listed under each machine; the others are counted by status.",
)
@bounded("--most", 1, 1000, TREE_MOST, about="Machines listed in all.")
@json_option()
def tree(machine_id: str, shown: int, most: int, as_json: bool) -> None:
    """Show a machine and the children its fan-outs started, down the tree: each with its
    type, state and status."""
    show(client().tree(machine_id, shown, most), as_json, views.tree, lambda found: found.to_dict())


def _known(
    kind: str, names: Callable[[Client], list[str]], nested: bool = False
) -> Callable[..., str | None]:
    """A filter's callback: the value refused (as the HTTP API does) unless a definition names
    it (a child's machine type, `TYPE.STATE[.branch]`, is named by its place in its root's)."""

    def check(_ctx: click.Context, _param: click.Parameter, value: str | None) -> str | None:
        named = value.split(".")[0] if nested and value is not None else value
        if value is not None and named not in (known := names(client())):
            raise click.BadParameter(f"unknown {kind} {value!r}: one of {', '.join(known)}")
        return value

    return check


@click.command("list")
@click.option("--agent-type", callback=_known("agent type", lambda fsm: fsm.agent_types()))
@click.option("--status", type=click.Choice(views.STATUSES))
@click.option(
    "--type",
    "machine_type",
    callback=_known("machine type", lambda fsm: fsm.machine_types(), nested=True),
)
@click.option("--parent", metavar="MACHINE_ID", help="The children of this machine.")
@limit_option()
@json_option()
def list_(
    agent_type: str | None,
    status: str | None,
    machine_type: str | None,
    parent: str | None,
    limit: int,
    as_json: bool,
) -> None:
    """List machines, newest first."""
    found = client().list_machines(
        agent_type=agent_type, status=status, machine_type=machine_type, parent=parent, limit=limit
    )
    show(found, as_json, views.machines, lambda found: [m.to_dict() for m in found])


def _admin_command(action: str, doc: str, needs_target: bool = False) -> click.Command:
    @click.command(action, help=doc)
    @click.argument("machine_id")
    @_target(needs_target)
    @audited("Why; kept in the history.")
    def command(machine_id: str, reason: str, actor: str, target: str | None = None) -> None:
        fsm = client()
        if target is not None:
            info = fsm.force(machine_id, target, actor, reason)
        else:
            info = getattr(fsm, action)(machine_id, actor, reason)
        click.echo(f"{info.id}  {info.status}  {info.current_state}")

    return command


def _target(needs_target: bool) -> Callable[[Any], Any]:
    """`force`'s TARGET argument; nothing for the other admin commands."""
    return click.argument("target") if needs_target else lambda command: command


@click.command()
@click.argument("machine_id")
@click.option(
    "--tokens", type=click.IntRange(min=0, max=BIGINT_MAX), default=None, help="Token budget."
)
@click.option("--cost", type=click.FloatRange(min=0, max=1e15), default=None, help="Cost budget.")
@audited("Why; kept with the change.")
def budget(
    machine_id: str, tokens: int | None, cost: float | None, reason: str, actor: str
) -> None:
    """Set a machine's budget (unset: no limit); one paused over budget resumes within it."""
    info = client().set_budget(machine_id, actor, tokens=tokens, cost=cost, reason=reason)
    click.echo(
        f"{info.id}  {info.status}  tokens {info.tokens_used}/{info.budget_tokens or '-'}"
        f"  cost {info.cost:g}/{info.budget_cost if info.budget_cost is not None else '-'}"
    )


COMMANDS = (
    start,
    status,
    context,
    tree,
    list_,
    _admin_command("pause", "Pause a running machine (acks for it are then refused)."),
    _admin_command("resume", "Resume a paused machine: its current state is entered again."),
    _admin_command("cancel", "Cancel a running or paused machine."),
    _admin_command("retry", "Enter the current state again (a failed machine: where it failed)."),
    _admin_command(
        "force", "Move a machine to TARGET state, whatever its status.", needs_target=True
    ),
    budget,
)
