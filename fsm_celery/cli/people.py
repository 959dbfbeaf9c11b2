"""The command line's people at approval gates: `approve`, `reject` and `approvals`.

The CLI holds the database's credentials, so it decides as an admin may, at any gate. Its
decision is an override (the gate decided outright, counted as nobody's vote) recorded as the
OS user running it; --actor names whom other commands record.
"""

from __future__ import annotations

from typing import Any

import click

from fsm_celery.cli.common import (
    client,
    echo_json,
    echo_table,
    fields,
    json_object,
    json_option,
    limit_option,
    operator,
)
from fsm_celery.terminal import safe


def _decision(choice: str, doc: str) -> click.Command:
    @click.command(choice, help=doc)
    @click.argument("machine_id")
    @click.option(
        "--field", "field", multiple=True, callback=fields, help="A form field: KEY=VALUE."
    )
    @click.option(
        "--fields", "fields_json", default="{}", callback=json_object, help="Form fields (JSON)."
    )
    @click.option("--comment", default="", help="Why; kept with the decision.")
    @click.option("--attempt", type=click.IntRange(min=1), help="Only at this visit's gate.")
    @json_option()
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
@limit_option()
@json_option()
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
    echo_table(header, rows, "no approval is waiting")


COMMANDS = (
    _decision("approve", "Approve at a machine's approval gate (fill its form with --field)."),
    _decision("reject", "Reject at a machine's approval gate."),
    approvals,
)
