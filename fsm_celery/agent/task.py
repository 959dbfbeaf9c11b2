"""One task as a handler sees it (Task), and what the agent keeps of it while it runs (Slot)."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fsm_celery.core.messages import TASK_MESSAGE_TYPES, StateTask


class HandBack(Exception):
    """Raised by a handler to give the attempt back (`state_handback`): sent again at once, to
    another agent if one is live, without counting a retry (past `max_handbacks` in a row, a
    failure)."""


@dataclass(eq=False)
class Slot:
    """A task the agent works on: where it was read, and whether its answer still counts."""

    stream: str
    entry_id: str
    message: StateTask
    cancelled: threading.Event = field(default_factory=threading.Event)  # its answer is dropped
    ended: threading.Event = field(default_factory=threading.Event)  # no more heartbeats
    cancel_async: Callable[[], None] | None = None  # cancels an async handler's asyncio task

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream, self.entry_id)


@dataclass
class Task:
    """One state attempt handed to a handler."""

    message: StateTask
    _send: Callable[[dict[str, Any]], None] = field(repr=False)
    _slot: Slot | None = field(default=None, repr=False)

    @property
    def machine_id(self) -> str:
        return str(self.message.machine_id)

    @property
    def machine_type(self) -> str:
        return self.message.machine_type

    @property
    def state(self) -> str:
        return self.message.state

    @property
    def attempt(self) -> int:
        return self.message.attempt

    @property
    def context(self) -> dict[str, Any]:
        return self.message.context

    @property
    def prompt(self) -> str:
        return self.message.prompt

    @property
    def cancelled(self) -> bool:
        """Whether the agent dropped this attempt (cancelled by the engine, superseded by a
        newer one, or handed back): stop, whatever the handler returns is not sent."""
        return self._slot is not None and self._slot.cancelled.is_set()

    def wait_cancelled(self, seconds: float) -> bool:
        """Sleep up to `seconds`, waking early if the attempt is dropped; whether it was."""
        if self._slot is None:
            time.sleep(seconds)
            return False
        return self._slot.cancelled.wait(seconds)

    def progress(self, text: str) -> None:
        """Send a heartbeat now, with progress text shown on the machine."""
        if self._slot is not None and self._slot.ended.is_set():
            return  # the attempt was decided: a heartbeat for it would only be refused
        self._send(reply(self.message, "state_heartbeat", progress=text[:2000]))


async def cancellable(work: Awaitable[Mapping[str, Any]], slot: Slot | None) -> Mapping[str, Any]:
    """Await an async handler's work as a task that dropping the slot cancels."""
    current = asyncio.current_task()
    if slot is not None and current is not None:
        loop = asyncio.get_running_loop()
        slot.cancel_async = lambda: _call_soon(loop, current.cancel)
        if slot.cancelled.is_set():  # dropped before the callback was in place
            raise asyncio.CancelledError
    return await work


def _call_soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    with contextlib.suppress(RuntimeError):  # the handler finished and its loop closed
        loop.call_soon_threadsafe(callback)


def reply(task: StateTask, kind: str, **fields: Any) -> dict[str, Any]:
    """An agent's message about the task's attempt (ack, heartbeat, hand-back)."""
    return {
        "type": kind,
        "machineId": str(task.machine_id),
        "state": task.state,
        "attempt": task.attempt,
        "taskToken": task.task_token,
        **fields,
    }


def where(loc: tuple[int | str, ...]) -> str:
    """A task message's error location without the message type the union leads it with."""
    if loc and loc[0] in TASK_MESSAGE_TYPES:
        loc = loc[1:]
    return ".".join(map(str, loc)) or "message"
