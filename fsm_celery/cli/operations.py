"""The command line's operations: a deployment written (`init`), its schema migrated (`db
upgrade`), checked (`doctor`), and watched (`stats`, `rejected`)."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from fsm_celery import views
from fsm_celery.cli.common import client, json_option, limit_option, show
from fsm_celery.config import get_settings


@click.group()
def db() -> None:
    """Database schema."""


@db.command("upgrade")
@click.option("--revision", default="head", show_default=True)
@click.option(
    "--create",
    is_flag=True,
    help="Create the database first when it does not exist (CREATE DATABASE, through the "
    "server's postgres database: the user needs the CREATEDB privilege).",
)
def db_upgrade(revision: str, create: bool) -> None:
    """Create or migrate the schema."""
    from sqlalchemy.engine import make_url

    from fsm_celery.store.db import connect, create_database, upgrade

    url = get_settings().database_url
    if create and create_database(url):
        click.echo(f"created database {make_url(url).database}")
    upgrade(connect(url), revision)
    click.echo(f"database at {revision}")


@click.command()
def doctor() -> None:
    """Check the deployment: database and migrations, Redis, definitions, workers, beat,
    bridges, token secret; one line each, with the fix. Exit status 1 when any fails."""
    from fsm_celery.doctor import run

    if not run(get_settings(), click.echo):
        sys.exit(1)


@click.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--force", is_flag=True, help="Overwrite the files init writes.")
def init(directory: Path, force: bool) -> None:
    """Write a starter deployment in DIRECTORY: definitions/ (the shipped ones, to edit) and a
    .env with every main setting, a freshly generated task token secret, the dashboard's
    tokens and Flower's password."""
    import shlex

    from fsm_celery.init import init as write

    for path in write(directory, force):
        click.echo(f"wrote {path}")
    click.echo("next, from that folder (the .env's relative paths are read from it):")
    click.echo(f"  cd {shlex.quote(str(directory))}; set -a; . ./.env; set +a")
    click.echo("  fsm-celery db upgrade --create && fsm-celery definitions load")
    click.echo("  fsm-celery doctor")


@click.command()
@json_option("Everything, durations in milliseconds.")
def stats(as_json: bool) -> None:
    """Machines per type and status; attempts, durations and success per state; usage;
    rejected messages per reason."""
    show(client().stats(), as_json, views.stats)


@click.command()
@click.option("--machine-id")
@limit_option(most=None)
@click.option("--parked", is_flag=True, help="Messages parked in the dead-letter stream instead.")
@json_option()
def rejected(machine_id: str | None, limit: int, parked: bool, as_json: bool) -> None:
    """List rejected messages, newest first (--parked: those the bridge could not even record)."""
    if parked:
        show(client().parked(limit), as_json, views.parked)
        return
    show(client().rejected(machine_id, limit), as_json, views.rejected)


COMMANDS = (db, doctor, init, stats, rejected)
