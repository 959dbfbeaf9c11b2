"""What every state kind implements (engine/kinds): entering a state of its kind."""

from __future__ import annotations

from typing import NamedTuple, Protocol

from sqlalchemy import Connection

from fsm_celery.core.definition import MachineDefinition, StateDefinition
from fsm_celery.core.transition import Machine
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.writes import Rows, Writes


class Entering(NamedTuple):
    """A machine entering a state, in a transaction: its row (locked), its definition and the
    state, the machines the transaction holds (locked, or started by it), its Writes, and the
    machine as the transaction has left it."""

    conn: Connection
    rows: Rows
    row: AnyRow
    definition: MachineDefinition
    state: StateDefinition
    writes: Writes
    machine: Machine  # as the transaction has left it so far (Writes.machine)


class StateKind(Protocol):
    def enter_txn(self, at: Entering) -> None:
        """Enter the machine's state: record on the Writes that it is entered (and what to
        send), or a transition when it cannot be (a state whose instruction cannot be made
        fails)."""
        ...
