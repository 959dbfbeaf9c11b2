"""What a use case decided and did not enter itself: the steps each to be entered next (pure
data; the engine hands them on through its Handoff port, fsm_celery.engine.ports)."""

from __future__ import annotations

from typing import NamedTuple
from uuid import UUID


class Step(NamedTuple):
    """A machine, the attempt whose state must be entered next, and how long to wait first
    (its type, the state name and a new child's parent travel along for people: Flower shows
    them, and the children a fan-out starts are sent as one group)."""

    machine_id: UUID
    attempt: int
    delay: float = 0.0
    state: str = ""
    machine_type: str = ""
    parent_id: UUID | None = None
    root_id: UUID | None = None  # the top-level machine of its tree (none: it is one): its trace


Next = list[Step]
"""What every use case of the engine returns: the states it decided and did not enter itself,
each to be entered after its delay, through a Handoff (the scan enters any whose hand-off is
lost). A state the use case entered is not in it: its state_task is already sent."""
