"""What goes into the engine (agents' raw messages) and what comes out (the steps to enter)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
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


Sending = tuple[UUID, int, str]  # a state_task: its machine, attempt and state


class Sent:
    """The state_tasks sent by transactions that then failed, and where each went.

    The transaction that applies the same messages again (a batch split, or tried again once
    the database is back) decides the same attempts: it records their dispatch, to the same
    agent, without sending them a second time (DESIGN.md, invariant 8). A commit forgets its
    own; the oldest are forgotten past `most` (a message parked for good never commits).
    """

    def __init__(self, most: int = 10_000) -> None:
        self._most = most
        self._where: OrderedDict[Sending, str] = OrderedDict()
        self._lock = threading.Lock()  # the bridge's sources share their applier

    def where(self, sending: Sending) -> str | None:
        """The agent (or agent type) the state_task was sent to, if it was."""
        if not self._where:  # nearly always: no transaction failed after sending
            return None
        with self._lock:
            return self._where.get(sending)

    def add(self, sent: Mapping[Sending, str]) -> None:
        with self._lock:
            self._where.update(sent)
            while len(self._where) > self._most:
                self._where.popitem(last=False)

    def forget(self, committed: Mapping[Sending, str]) -> None:
        if not committed:
            return
        with self._lock:
            for sending in committed:
                self._where.pop(sending, None)
