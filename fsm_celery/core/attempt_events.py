"""What happens to a machine's current attempt: the events decide() takes (an agent's ack, its
deadline, a hand-back, a dispatch that failed, a fan-out's join, people's verdict, an outside
event)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class _ForAttempt:
    """What every event names: the state and the attempt it is for."""

    state: str
    attempt: int


@dataclass(frozen=True)
class _Outcome(_ForAttempt):
    """The attempt's work done or not, with its output, or why not."""

    success: bool
    output: Mapping[str, Any] = field(default_factory=dict)
    error: str | None = None


@dataclass(frozen=True)
class Ack(_Outcome):
    """An agent's answer for one attempt."""


@dataclass(frozen=True)
class Timeout(_ForAttempt):
    """The attempt's deadline passed without an ack."""


@dataclass(frozen=True)
class HandBack(_ForAttempt):
    """The agent gives the attempt back undone (it is shutting down)."""

    reason: str | None = None


@dataclass(frozen=True)
class DispatchFailed(_ForAttempt):
    """The attempt could not be sent: its prompt did not render, or routing it failed."""

    error: str


@dataclass(frozen=True)
class Joined(_Outcome):
    """A fan-out's join was decided: its children's merged output, or why it failed."""


@dataclass(frozen=True)
class GateDecided(_ForAttempt):
    """The people deciding an approval state reached its verdict (fsm_celery.core.gate):
    approved or rejected, with the closing decision's fields and the gate's summary."""

    approved: bool
    output: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class EventArrived(_ForAttempt):
    """The outside event a waiting state waits for arrived, with its payload
    (fsm_celery.core.signal)."""

    name: str
    payload: Mapping[str, Any] = field(default_factory=dict)


Event = Ack | Timeout | HandBack | DispatchFailed | Joined | GateDecided | EventArrived
