"""The Python client: start, inspect and command machines (the CLI and the HTTP API run on it;
what it returns is fsm_celery.records').

`Client` works on the parts it is given (fsm_celery.wiring builds them from settings);
fsm_celery.api's functions use the process's default client, built from FSM_* settings.

It is composed of one part per concern, a module each, over client/base.py's ClientBase (the
engine, the handoff, and the store's reads: fsm_celery.store.reader): machines.py,
approvals.py, events.py, agents.py, definitions.py, history.py (and time travel),
schedules.py, operations.py. Every method stays on `Client` itself.
"""

from __future__ import annotations

from fsm_celery.client.agents import Agents
from fsm_celery.client.approvals import Approvals
from fsm_celery.client.definitions import Definitions
from fsm_celery.client.events import Events
from fsm_celery.client.history import History
from fsm_celery.client.machines import FAN_OUTS, TREE_MOST, TREE_SHOWN, Machines
from fsm_celery.client.operations import Operations
from fsm_celery.client.schedules import Schedules
from fsm_celery.records import MachineInfo, TransitionRecord

__all__ = ["FAN_OUTS", "TREE_MOST", "TREE_SHOWN", "Client", "MachineInfo", "TransitionRecord"]


class Client(Machines, Approvals, Events, Agents, Definitions, History, Schedules, Operations):
    """Starts and inspects machines. Entering states is handed to `enqueue` (Celery, normally)."""
