"""The command line's outside events: `send-event` and `events`. The CLI holds the database's
credentials, so it may send any event; --actor names the sender it records."""

from __future__ import annotations

from typing import Any

import click

from fsm_celery.cli.common import (
    actor_option,
    client,
    echo_json,
    echo_table,
    json_object,
    json_option,
)
from fsm_celery.terminal import safe


@click.command("send-event")
@click.argument("machine_id")
@click.argument("name")
@click.option("--payload", default="{}", callback=json_object, help="The payload (JSON object).")
@click.option("--key", default=None, help="Your id for it: sent again, it is one event.")
@json_option()
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
@json_option()
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
    echo_table(header, rows, "no event was sent to it")


COMMANDS = (send_event, events)
