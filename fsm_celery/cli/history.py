"""`fsm-celery history`: a machine's transitions (`history MACHINE_ID`), and the history's
monthly partitions on PostgreSQL (`history months`, `history archive`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import NoReturn
from uuid import UUID

import click

from fsm_celery import views
from fsm_celery.cli.common import Duration, client, echo_json, echo_lines, json_option
from fsm_celery.config import ARCHIVE_TABLE
from fsm_celery.exceptions import ARCHIVED, MachineNotFound
from fsm_celery.exits import Exit
from fsm_celery.records import TransitionRecord
from fsm_celery.terminal import table

SQLITE = "the history is partitioned on PostgreSQL only (this database is SQLite)"


class MachineOrCommand(click.Group):
    """`history MACHINE_ID` shows a machine's; `history months` and `history archive` are
    commands of their own (no machine id is a command's name: ids are hex digits)."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        words = [a for a in args if not a.startswith("-")]
        if words and words[0] not in self.commands:
            args = ["show", *args]
        return super().parse_args(ctx, args)


@click.group(cls=MachineOrCommand)
def history() -> None:
    """A machine's transitions (history MACHINE_ID), and the history's monthly partitions."""


@history.command("show")
@click.argument("machine_id")
@click.option(
    "--context", "with_context", is_flag=True, help="What each step changed in the context."
)
@json_option()
def show(machine_id: str, with_context: bool, as_json: bool) -> None:
    """Show a machine's transitions: who moved it, why, and how long each state took; with
    --context, what each changed in the context (--json: and the context after it)."""
    records = client().history(machine_id, context=with_context)
    if not records:  # every machine has its start's row
        click.echo(f"machine {machine_id} has no history: {ARCHIVED}", err=True)
    source, inherited = _inherited(machine_id, with_context)
    if as_json:
        earlier = [r.to_dict() | {"inherited_from": str(source)} for r in inherited]
        echo_json(earlier + [r.to_dict() for r in records])
        return
    show = views.changes if with_context else views.history
    if inherited:
        echo_lines([f"steps 0-{inherited[-1].attempt} inherited from {source}:", *show(inherited)])
        click.echo("this fork's own steps:")
    echo_lines(show(records))


def _inherited(machine_id: str, with_context: bool) -> tuple[UUID | None, list[TransitionRecord]]:
    """A fork's source and the source's steps up to the one it was forked from (a fork's
    earlier steps are its source's); no steps for a machine that is no fork."""
    fsm = client()
    info = fsm.get_machine(machine_id)
    if info.forked_from is None or info.forked_at is None:
        return None, []
    try:
        records = fsm.history(info.forked_from, context=with_context)
    except MachineNotFound:  # the source was deleted: the fork's own steps are all there is
        return info.forked_from, []
    return info.forked_from, [r for r in records if r.attempt <= info.forked_at]


@history.command("months")
@click.option("--make", is_flag=True, help="Make the months ahead first (beat does, hourly).")
@json_option()
def months(make: bool, as_json: bool) -> None:
    """List the monthly partitions of the history and of the rejected messages (PostgreSQL):
    each month's rows (PostgreSQL's estimate) and size."""
    fsm = client()
    if make:
        for outcome in fsm.engine.retention.make_ahead():
            click.echo(outcome.line(), err=True)
    found = fsm.history_months()
    if not found:
        _sqlite()
    if as_json:
        echo_json(
            {
                table: [
                    {
                        "name": p.name,
                        "from": p.start.isoformat(),
                        "to": p.end.isoformat(),
                        "rows": max(p.rows, 0),
                        "bytes": p.size,
                    }
                    for p in listed
                ]
                for table, listed in found.items()
            }
        )
        return
    rows = [
        (table, f"{p.start:%Y-%m}", f"{max(p.rows, 0):,}", _size(p.size), p.name)
        for table, listed in found.items()
        for p in listed
    ]
    echo_lines(table(("TABLE", "MONTH", "ROWS", "SIZE", "PARTITION"), rows))


@history.command("archive")
@click.option(
    "--older-than",
    "days",
    type=Duration("days", 86_400, 36_500, positive=True),
    default=None,
    help="How long past its machines' month a month is kept: days, or 90d, 12h "
    "[default: FSM_HISTORY_RETENTION_DAYS].",
)
@click.option(
    "--to",
    "directory",
    type=click.Path(file_okay=False, path_type=Path),
    default=None,
    help="Write each month to DIRECTORY/<partition>.csv.gz before dropping it.",
)
@click.option("--table", "as_table", is_flag=True, help="Keep each month as a table (fsm_archive).")
@click.option("--drop", is_flag=True, help="Drop each month, archived nowhere.")
@click.option("--dry-run", is_flag=True, help="Say which months would go; change nothing.")
def archive(
    days: float | None, directory: Path | None, as_table: bool, drop: bool, dry_run: bool
) -> None:
    """Archive and remove the months of history past their retention now, as beat does every
    hour (a month goes once all its machines ended and none changed for that long); the
    rejected messages' months past FSM_REJECTED_RETENTION_DAYS too. Without --to, --table or
    --drop, FSM_HISTORY_ARCHIVE says where the months go."""
    if sum((directory is not None, as_table, drop)) > 1:
        raise click.UsageError("give one of --to, --table and --drop")
    fsm = client()
    if days is None and fsm.engine.settings.history_retention_days == 0:
        raise click.UsageError(
            "FSM_HISTORY_RETENTION_DAYS is 0 (the history is kept forever): give --older-than"
        )
    where = None
    if directory is not None:
        where = str(directory.resolve())
    elif as_table:
        where = ARCHIVE_TABLE
    elif drop:
        where = ""
    if not fsm.engine.retention.partitioned:
        _sqlite()
    done = fsm.archive_history(days, where, dry_run)
    echo_lines([o.line() for o in done] or ["nothing to archive"])
    if any(o.action == "failed" for o in done):
        click.echo("some months could not be archived (above); the next run tries again", err=True)
        sys.exit(Exit.FAILED)


def _sqlite() -> NoReturn:
    click.echo(SQLITE, err=True)
    sys.exit(Exit.FAILED)


def _size(size: int) -> str:
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1024:
            return f"{size:.0f} {unit}"
        size /= 1024  # type: ignore[assignment]
    return f"{size:.1f} TB"


COMMANDS = (history,)
