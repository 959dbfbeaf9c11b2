"""The state_tasks a failed transaction sent, so that the next try records them instead of
sending them again (DESIGN.md, invariant 8)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from typing import TYPE_CHECKING
from uuid import UUID

if TYPE_CHECKING:
    from fsm_celery.core.messages import StateEvent, StateTask

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


class Outgoing:
    """What one transaction sends: its state_tasks before it commits (`to_send`, where each
    went in `sending`), its transitions' events and its state_cancels once it committed
    (engine.runtime.Runtime.transaction). A state_task a failed try sent already (`sent`) is
    recorded where it went, not sent again."""

    def __init__(self, sent: Sent | None = None) -> None:
        self.sent = sent
        self.to_send: list[tuple[str, str]] = []  # (agent, state_task)
        self.sending: dict[Sending, str] = {}  # dispatched here: where to
        self.events: list[StateEvent] = []  # announced once committed
        self.cancels: list[tuple[str, str]] = []  # (agent, state_cancel), too

    def dispatch(self, sending: Sending, agent: str, task: StateTask) -> None:
        self.sending[sending] = agent
        if self.sent is None or self.sent.where(sending) is None:
            self.to_send.append((agent, task.to_wire()))

    def sent_before(self, sending: Sending) -> str | None:
        """Where a failed transaction sent this state_task, if one did."""
        return None if self.sent is None else self.sent.where(sending)
