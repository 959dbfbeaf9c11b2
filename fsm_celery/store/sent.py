"""The state_tasks a failed transaction sent, so that the next try records them instead of
sending them again (DESIGN.md, invariant 8)."""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Mapping
from uuid import UUID

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
        # what was sent and where; nearly always empty (no transaction failed after sending),
        # which a caller reads before it asks `where`
        self.pending: OrderedDict[Sending, str] = OrderedDict()
        self._lock = threading.Lock()  # the bridge's sources share their applier

    def where(self, sending: Sending) -> str | None:
        """The agent (or agent type) the state_task was sent to, if it was."""
        with self._lock:
            return self.pending.get(sending)

    def add(self, sent: Mapping[Sending, str]) -> None:
        with self._lock:
            self.pending.update(sent)
            while len(self.pending) > self._most:
                self.pending.popitem(last=False)

    def forget(self, committed: Mapping[Sending, str]) -> None:
        if not committed:
            return
        with self._lock:
            for sending in committed:
                self.pending.pop(sending, None)
