"""The agent door's sessions (fsm_celery.mcp.agent.Sessions), pure: a session is told once that
its task was cancelled; a session gone quiet long after its task was cancelled is forgotten
when another session takes a task, so that sessions that ended without a word do not pile up."""

from __future__ import annotations

import time
from types import SimpleNamespace
from typing import Any

from fsm_celery.mcp.agent import CANCELLED, FORGET_AFTER, HandOff, Held, Sessions


def held(cancelled: bool = False, dropped_ago: float | None = None) -> Held:
    task: Any = SimpleNamespace(cancelled=cancelled)
    found = Held(task)
    if dropped_ago is not None:
        found.dropped = time.monotonic() - dropped_ago
    return found


def test_a_cancelled_task_is_reported_once_then_the_session_holds_none() -> None:
    sessions = Sessions(HandOff())
    sessions.hold("a", held(cancelled=True, dropped_ago=1))
    assert sessions.current("a") == (None, CANCELLED)
    assert sessions.current("a")[0] is None and sessions.held == {}


def test_sessions_quiet_long_after_their_task_was_cancelled_are_forgotten() -> None:
    sessions = Sessions(HandOff())
    sessions.hold("gone", held(cancelled=True, dropped_ago=FORGET_AFTER + 1))
    sessions.hold("recent", held(cancelled=True, dropped_ago=1))
    sessions.hold("working", held())
    sessions.hold("new", held())
    assert sorted(sessions.held) == ["new", "recent", "working"]
    assert sessions.current("recent") == (None, CANCELLED)  # still told
