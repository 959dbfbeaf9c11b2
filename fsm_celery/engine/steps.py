"""What goes into the engine (agents' raw messages) and what comes out (the steps to enter)."""

from __future__ import annotations

from typing import NamedTuple
from uuid import UUID


class Inbound(NamedTuple):
    """A raw message from Redis, and the agent that sent it when where it came from says so
    (its own ack stream, which only it may write under the Redis ACLs)."""

    raw: str
    agent: UUID | None = None


class Step(NamedTuple):
    """A machine, the attempt whose state must be entered next, and how long to wait first
    (its type and the state name travel along for people: Flower shows them)."""

    machine_id: UUID
    attempt: int
    delay: float = 0.0
    state: str = ""
    machine_type: str = ""


Next = list[Step]
"""What every use case of the engine returns: the states it decided and did not enter itself,
each to be entered after its delay, by an fsm.enter_state task (the scan enters any whose task
is lost). A state the use case entered is not in it: its state_task is already sent."""


class Scanned(NamedTuple):
    """What a scan did: how many machines it handled (a full batch: scan again at once), and
    its Next."""

    handled: int
    next: Next
