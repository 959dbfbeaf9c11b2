"""`celery -A fsm_celery flower` refuses to serve without authentication.

Flower listens on every interface by default and, without credentials, shows every task's
arguments and lets anyone revoke tasks or shut workers down. So the project's app checks
Flower's options as Flower starts (Flower loads the app's modules then, which sends Celery's
`import_modules` signal) and stops it unless:

- basic auth is set, from the environment (`FLOWER_BASIC_AUTH=user:password[,user:password]`)
  or `--basic_auth`, every entry with a user and a password; or OAuth (`--auth`);
- or `--unauthenticated` is given: Flower then serves its pages and API without credentials,
  on 127.0.0.1 only (an explicit non-loopback `--address` is refused), and says so loudly.

It also shows each task's args in the task list (what machine, state and attempt it is for).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

import click
from celery.signals import import_modules

from fsm_celery.exceptions import InsecureFlower

log = logging.getLogger(__name__)

UNAUTHENTICATED = "--unauthenticated"
# Flower's task list shows a task's name but not its args, and the args are what say which
# machine, state and attempt an fsm task is for (argsrepr: worker/enqueue.py, acks/relay.py):
# shown unless --tasks_columns (FLOWER_TASKS_COLUMNS) chose other columns.
FLOWER_COLUMNS = "name,uuid,state,received,runtime,worker"
FSM_COLUMNS = "name,args,state,received,runtime,worker,uuid"
LOOPBACK = ("127.0.0.1", "localhost", "::1")


def checked_address(
    basic_auth: Sequence[str] | None, oauth: str, address: str, unauthenticated: bool
) -> str:
    """The address Flower may listen on with these options; InsecureFlower if none."""
    if basic_auth:
        for entry in basic_auth:
            user, _, password = entry.partition(":")
            if not user or not password:
                raise InsecureFlower(
                    "each basic auth entry must be user:password, both non-empty "
                    "(FLOWER_BASIC_AUTH=user:password[,user:password])"
                )
        return address
    if oauth:
        return address
    if not unauthenticated:
        raise InsecureFlower(
            "Flower needs credentials: set FLOWER_BASIC_AUTH=user:password (or --basic_auth, "
            f"or OAuth with --auth), or serve this machine only with {UNAUTHENTICATED}"
        )
    if address and address not in LOOPBACK:
        raise InsecureFlower(
            f"{UNAUTHENTICATED} serves on 127.0.0.1 only, not on --address={address}; "
            "set FLOWER_BASIC_AUTH=user:password to serve beyond this machine"
        )
    return address or "127.0.0.1"


def guard() -> None:
    """Check Flower's options whenever Flower starts in this process."""
    import_modules.connect(_guard_flower, weak=False, dispatch_uid="fsm_celery.flower")


def _guard_flower(**_: Any) -> None:
    """Check Flower's options as it starts (a no-op in every other process)."""
    context = click.get_current_context(silent=True)
    if context is None or context.command.name != "flower":
        return
    from tornado.options import options

    unauthenticated = UNAUTHENTICATED in context.params.get("tornado_argv", ())
    try:
        address = checked_address(
            options.basic_auth, options.auth, options.address, unauthenticated
        )
    except InsecureFlower as exc:
        sys.exit(f"fsm-celery: {exc}")
    if options.tasks_columns == FLOWER_COLUMNS:
        options.tasks_columns = FSM_COLUMNS
    if options.basic_auth or options.auth:
        return
    options.address = address  # Flower's default ('') is every interface
    os.environ["FLOWER_UNAUTHENTICATED_API"] = "true"  # Flower's own switch for its API
    log.warning(
        "FLOWER RUNS WITHOUT AUTHENTICATION (%s): anyone on this machine can read every task "
        "and revoke tasks or shut workers down; it serves on %s only",
        UNAUTHENTICATED,
        address,
    )
