"""Moving messages between the engine and agents: Redis in production, memory for the demo."""

from __future__ import annotations

from typing import Protocol


class Publisher(Protocol):
    """Sends one message to a channel; returns how many listeners received it."""

    def publish(self, channel: str, message: str) -> int: ...
