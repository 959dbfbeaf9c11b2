"""The fsm-celery command line: the root group, and the commands of each part, by whom they
serve (what they share is cli/common.py):

- machines.py: start, status, context, tree, list; pause, resume, cancel, retry, force, budget
- people.py: approve, reject, approvals (the gates people decide)
- events.py: send-event, events (outside events)
- time_travel.py: rewind, fork, replay
- definitions.py: definitions validate, check, load
- agents.py: agents (list, credentials, revoke), agent, schema
- schedules.py: schedules (list, show, pause, resume, trigger)
- history.py: history (a machine's; its monthly partitions: months, archive)
- processes.py: ack-bridge, dashboard, demo, dev, stop
- operations.py: init, db upgrade, doctor, stats, rejected
- mcp.py: mcp operator (the MCP server for operators)
"""

from __future__ import annotations

import logging

import click

from fsm_celery.cli import (
    agents,
    definitions,
    events,
    history,
    machines,
    mcp,
    operations,
    people,
    processes,
    schedules,
    time_travel,
)
from fsm_celery.exits import EPILOG, FailCleanly

PARTS = (
    machines,
    people,
    events,
    time_travel,
    definitions,
    agents,
    schedules,
    history,
    processes,
    operations,
    mcp,
)


@click.group(cls=FailCleanly, epilog=EPILOG)
@click.version_option(package_name="fsm-celery", prog_name="fsm-celery")
@click.option("-v", "--verbose", is_flag=True, help="Log at INFO level; tracebacks on errors.")
def main(verbose: bool) -> None:
    """Durable, declarative state machines that drive AI agents.

    A MACHINE_ID is a machine's id or the start of it (4 hex digits or more, as the dashboard's
    8), as git takes a commit's.
    """
    logging.basicConfig(
        level=logging.INFO if verbose else logging.WARNING,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )


for _part in PARTS:
    for _command in _part.COMMANDS:
        main.add_command(_command)
