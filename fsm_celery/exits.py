"""How a process ends on an error (the CLI's commands, and the worker, beat, bridge and
dashboard at start): one line on stderr naming what was wrong and what to do, and an exit
status by kind; the traceback only with -v. The errors themselves are fsm_celery.exceptions's."""

from __future__ import annotations

import sys
import traceback
from enum import IntEnum
from typing import Any, NoReturn

import click

from fsm_celery.terminal import safe


class Exit(IntEnum):
    FAILED = 1  # the operation failed: no such machine, a refused command, a failed check
    USAGE = 2  # a wrong option or argument (click's own)
    CONFIG = 3  # a bad FSM_* setting, definition or database schema
    UNREACHABLE = 4  # PostgreSQL or Redis cannot be reached


EPILOG = (
    "Exit status: 0 done, 1 the operation failed, 2 wrong usage, 3 bad configuration "
    "(FSM_* settings, definitions, schema), 4 PostgreSQL or Redis unreachable. "
    "Errors are one line; -v adds the traceback."
)
SECRET_FIELDS = ("url", "secret", "token")  # settings whose values an error message does not repeat


class FailCleanly(click.Group):
    """A group whose commands (and their subcommands) fail in one line."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except (click.exceptions.Exit, click.ClickException, click.Abort, BrokenPipeError):
            raise  # click ends quietly when the reader of the output went away (| head)
        except Exception as exc:
            verbose = bool(ctx.find_root().params.get("verbose"))
            fail(exc, verbose)


def fail(exc: BaseException, verbose: bool = False) -> NoReturn:
    if verbose:
        traceback.print_exception(exc, file=sys.stderr)
    message, status = describe(exc)
    click.echo(f"error: {safe(message)}", err=True)
    sys.exit(status)


def describe(exc: BaseException) -> tuple[str, Exit]:
    """The one line for an error, and the exit status of its kind."""
    import kombu.exceptions
    import pydantic
    import redis
    import sqlalchemy.exc

    from fsm_celery.exceptions import (
        DefinitionError,
        FsmError,
        InsecureDashboard,
        InsecureSecret,
    )

    if isinstance(exc, pydantic.ValidationError) and exc.title == "Settings":
        return _settings_error(exc), Exit.CONFIG
    if isinstance(exc, DefinitionError):
        more = f" (and {len(exc.problems) - 1} more problems)" if len(exc.problems) > 1 else ""
        return f"{exc.problems[0]}{more}", Exit.CONFIG
    if isinstance(exc, InsecureSecret | InsecureDashboard):
        return str(exc), Exit.CONFIG
    if isinstance(exc, FsmError):
        return _first_line(exc), Exit.FAILED
    if isinstance(exc, sqlalchemy.exc.ProgrammingError | sqlalchemy.exc.NoSuchTableError):
        return (
            f"the database has no fsm-celery schema, or an old one: run `fsm-celery db upgrade` "
            f"({_first_line(exc.orig if hasattr(exc, 'orig') else exc)})",
            Exit.CONFIG,
        )
    if isinstance(exc, sqlalchemy.exc.OperationalError) and _missing_database(exc):
        return _missing_database(exc), Exit.CONFIG
    if isinstance(exc, sqlalchemy.exc.OperationalError | sqlalchemy.exc.InterfaceError):
        return (
            f"cannot reach the database at {_database()}: {_first_line(exc.orig)}; "
            "check FSM_DATABASE_URL and that PostgreSQL runs",
            Exit.UNREACHABLE,
        )
    if isinstance(exc, sqlalchemy.exc.ArgumentError | sqlalchemy.exc.NoSuchModuleError):
        return f"FSM_DATABASE_URL: {_first_line(exc)}", Exit.CONFIG
    if isinstance(exc, redis.RedisError | kombu.exceptions.OperationalError):
        return (
            f"cannot reach Redis at {_redis()}: {_first_line(exc)}; check FSM_REDIS_URL "
            "(FSM_BROKER_URL) and that Redis runs",
            Exit.UNREACHABLE,
        )
    return (
        f"unexpected {type(exc).__name__}: {_first_line(exc)} (run with -v for the traceback)",
        Exit.FAILED,
    )


def _settings_error(exc: Any) -> str:
    """`FSM_NAME: what is wrong (got 'value')` for each setting in error."""
    parts = []
    for error in exc.errors():
        name = "_".join(str(part) for part in error["loc"])
        message = error["msg"].removeprefix("Value error, ")
        shown = ""
        if not any(word in name for word in SECRET_FIELDS):
            shown = f" (got {error.get('input')!r})"
        parts.append(f"FSM_{name.upper()}: {message}{shown}")
    return "; ".join(parts)


def _missing_database(exc: BaseException) -> str:
    """What to do when the server runs but lacks the database; empty for other errors."""
    from fsm_celery.config import get_settings
    from fsm_celery.store.db import missing_database

    name = missing_database(exc)
    if name is None:
        return ""
    return missing_database_fix(name, get_settings().database_url)


def missing_database_fix(name: str, url: str) -> str:
    """`database X does not exist — create it (createdb X) or ...`, in one line."""
    from fsm_celery.store.db import createdb_command

    return (
        f"database {name} does not exist — create it ({createdb_command(url)}) "
        "or let `fsm-celery db upgrade --create` do it"
    )


def _database() -> str:
    from fsm_celery.config import get_settings
    from fsm_celery.urls import mask

    return mask(get_settings().database_url)


def _redis() -> str:
    from fsm_celery.config import get_settings
    from fsm_celery.urls import mask

    return mask(get_settings().celery_broker_url)


def _first_line(exc: object) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0] if lines else type(exc).__name__
