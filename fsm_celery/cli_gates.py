"""The command line's people, outside events and time travel: `approve`, `reject`,
`approvals`, `send-event`, `events`, `rewind`, `fork`, `replay` and `definitions check`.

The CLI holds the database's credentials, so it decides as an admin may, at any gate, and may
send any event. Its decision at a gate is an override (the gate decided outright, counted as
nobody's vote) recorded as the OS user running it; --actor names whom other commands record.
"""

from __future__ import annotations

import json
import sys
from typing import Any

import click

from fsm_celery import views
from fsm_celery.cli_common import (
    actor_option,
    client,
    echo_json,
    echo_lines,
    json_object,
    operator,
)
from fsm_celery.core.replay import Outcome
from fsm_celery.exits import Exit
from fsm_celery.terminal import safe, table


def _fields(
    _ctx: click.Context, _param: click.Parameter, values: tuple[str, ...]
) -> dict[str, Any]:
    """--field k=v, repeated: v as JSON when it is JSON (42, true, "x", [1]), else as text."""
    fields: dict[str, Any] = {}
    for pair in values:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{pair!r} is not KEY=VALUE")
        try:
            fields[key] = json.loads(value)
        except (json.JSONDecodeError, RecursionError):
            fields[key] = value
    return fields


def _decision(choice: str, doc: str) -> click.Command:
    @click.command(choice, help=doc)
    @click.argument("machine_id")
    @click.option(
        "--field", "field", multiple=True, callback=_fields, help="A form field: KEY=VALUE."
    )
    @click.option(
        "--fields", "fields_json", default="{}", callback=json_object, help="Form fields (JSON)."
    )
    @click.option("--comment", default="", help="Why; kept with the decision.")
    @click.option("--attempt", type=click.IntRange(min=1), help="Only at this visit's gate.")
    @click.option("--json", "as_json", is_flag=True)
    @click.option("--actor", hidden=True, help="Refused: the OS user decides (an override).")
    def command(
        machine_id: str,
        field: dict[str, Any],
        fields_json: dict[str, Any],
        comment: str,
        attempt: int | None,
        as_json: bool,
        actor: str | None,
    ) -> None:
        me = operator()
        if actor is not None and actor != me:
            raise click.BadParameter(
                f"the CLI decides as the OS user ({me}), as an override of the gate: it cannot "
                f"decide as {actor!r} (an approver decides with their own token)",
                param_hint="--actor",
            )
        actor = me
        decided = client().decide(
            machine_id,
            choice,
            actor,
            fields={**fields_json, **field},
            comment=comment,
            via="cli",
            attempt=attempt,
        )
        if as_json:
            echo_json(decided)
            return
        click.echo(_said(decided, actor))

    return command


def _said(decided: dict[str, Any], actor: str) -> str:
    where = f"{decided['machine_id']}  {decided['state']}"
    if not decided["recorded"]:
        closed = f", which {decided['verdict']} the gate" if decided["verdict"] != "pending" else ""
        return f"{where}  {safe(actor)} decided already ({decided['decision']}{closed}): unchanged"
    if decided["override"]:
        moved = f": moved to {decided['moved_to']}" if decided["moved_to"] else ""
        return f"{where}  {decided['verdict']} by override of {safe(actor)}{moved}"
    count = f"{decided['approvals']}/{decided['needed']} approvals"
    if decided["rejections"]:
        count += f", {decided['rejections']} rejected"
    if decided["moved_to"] is None:
        return f"{where}  {decided['decision']} recorded: {count}, waiting"
    return f"{where}  {decided['verdict']} ({count}): moved to {decided['moved_to']}"


@click.command("approvals")
@click.option("--type", "machine_type", default=None, help="Of machines of this type only.")
@click.option("--limit", type=click.IntRange(min=1, max=10_000), default=50, show_default=True)
@click.option("--json", "as_json", is_flag=True)
def approvals(machine_type: str | None, limit: int, as_json: bool) -> None:
    """The approval gates waiting for people, soonest deadline first."""
    pending = client().approvals(limit, machine_type)
    if as_json:
        echo_json(pending)
        return
    rows = [
        (
            str(p["machine_id"])[:8],
            p["type"],
            p["state"],
            f"{p['approvals']}/{p['needed']}",
            p["rejections"],
            p["status"],
            str(p["deadline_at"])[:19],
        )
        for p in pending
    ]
    header = ("MACHINE", "TYPE", "STATE", "APPROVED", "REJECTED", "STATUS", "DEADLINE (UTC)")
    echo_lines(table(header, rows) if rows else ["no approval is waiting"])


@click.command("send-event")
@click.argument("machine_id")
@click.argument("name")
@click.option("--payload", default="{}", callback=json_object, help="The payload (JSON object).")
@click.option("--key", default=None, help="Your id for it: sent again, it is one event.")
@click.option("--json", "as_json", is_flag=True)
@actor_option()
def send_event(
    machine_id: str, name: str, payload: dict[str, Any], key: str | None, as_json: bool, actor: str
) -> None:
    """Send a machine an outside event: applied when it waits for it, else kept until it does."""
    done = client().send_event(machine_id, name, payload, actor, via="cli", key=key)
    if as_json:
        echo_json(done)
        return
    moved = f": moved to {done['moved_to']}" if done["moved_to"] else ""
    click.echo(f"{done['machine_id']}  {done['name']}  {done['outcome']}  {done['state']}{moved}")


@click.command("events")
@click.argument("machine_id")
@click.option("--json", "as_json", is_flag=True)
def events(machine_id: str, as_json: bool) -> None:
    """The outside events sent to a machine, oldest first: kept, applied or refused."""
    found = client().events(machine_id)
    if as_json:
        echo_json(found)
        return
    rows = [
        (str(e["received_at"])[:19], e["name"], e["outcome"], safe(e["sender"]), e["via"])
        for e in found
    ]
    header = ("RECEIVED (UTC)", "EVENT", "OUTCOME", "SENDER", "VIA")
    echo_lines(table(header, rows) if rows else ["no event was sent to it"])


@click.command("rewind")
@click.argument("machine_id")
@click.option("--to", "step", type=click.IntRange(min=0), required=True, help="The step.")
@click.option("--set", "edits", multiple=True, callback=_fields, help="An edit: KEY=VALUE.")
@click.option("--reason", default="", help="Why; kept in the history.")
@actor_option()
def rewind(machine_id: str, step: int, edits: dict[str, Any], reason: str, actor: str) -> None:
    """Put a machine back at the state it was in after a step (`history --context` shows them),
    with the context it had then and the edits over it, as a new attempt."""
    done = client().rewind(machine_id, step, actor, reason, edits)
    info = done.machine
    click.echo(f"{info.id}  {info.status}  {info.current_state}  step {done.step}")


@click.command("fork")
@click.argument("machine_id")
@click.option("--from", "step", type=click.IntRange(min=0), required=True, help="The step.")
@click.option("--set", "edits", multiple=True, callback=_fields, help="An edit: KEY=VALUE.")
@click.option("--reason", default="", help="Why; kept in its history.")
@actor_option()
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
@click.option("--json", "as_json", is_flag=True)
def replay(machine_id: str, path: str | None, version: int | None, as_json: bool) -> None:
    """Run a machine's recorded history again against a definition (its type's newest by
    default), calling no agent: step by step, whether it takes the same path, and where and
    why it diverges. Exit status 1 when it diverges."""
    if path is not None and version is not None:
        raise click.UsageError("give --definition or --version, not both")
    found = client().replay(machine_id, definition=path, version=version)
    if as_json:
        echo_json(found.to_dict())
    else:
        echo_lines(views.replay(found))
    if found.replay.outcome is Outcome.DIVERGED:
        sys.exit(Exit.FAILED)


@click.command("check")
@click.argument("path", type=click.Path(exists=True, dir_okay=False))
@click.option(
    "--replay-last",
    "count",
    type=click.IntRange(min=0, max=10_000),
    default=0,
    help="Replay the last N ended machines of its type against it.",
)
@click.option("--json", "as_json", is_flag=True)
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
    if as_json:
        echo_json([f.to_dict() for f in found])
    else:
        echo_lines(views.replays(found, path, definition.type))
    if any(f.replay.outcome is Outcome.DIVERGED for f in found):
        sys.exit(Exit.FAILED)


COMMANDS = (
    _decision("approve", "Approve at a machine's approval gate (fill its form with --field)."),
    _decision("reject", "Reject at a machine's approval gate."),
    approvals,
    send_event,
    events,
    rewind,
    fork,
    replay,
)
