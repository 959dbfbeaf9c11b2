"""One task as a handler sees it (Task), what the agent keeps of it while it runs (Slot), and
what it remembers of the tasks lately answered or cancelled (Recent)."""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import logging
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any, Generic, TypeVar

from pydantic import ValidationError

from fsm_celery.core.contract import flaws
from fsm_celery.core.messages import TASK_MESSAGE_TYPES, StateTask

log = logging.getLogger("fsm_celery.agent.sdk")

Problems = list[dict[str, str]]  # [{"pointer": ..., "message": ...}]


V = TypeVar("V")


class Recent(OrderedDict[Hashable, V], Generic[V]):
    """What was kept lately, the oldest forgotten past `size`."""

    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def keep(self, key: Hashable, value: V) -> None:
        self[key] = value
        while len(self) > self.size:
            self.popitem(last=False)


@dataclass(eq=False)
class Slot:
    """A task the agent works on: where it was read, and whether its answer still counts."""

    stream: str
    entry_id: str
    message: StateTask
    cancelled: threading.Event = field(default_factory=threading.Event)  # its answer is dropped
    ended: threading.Event = field(default_factory=threading.Event)  # no more heartbeats
    cancel_async: Callable[[], None] | None = None  # cancels an async handler's asyncio task
    problems: Problems = field(default_factory=list)  # the engine refused its answer for these

    @property
    def key(self) -> tuple[str, str]:
        return (self.stream, self.entry_id)


@dataclass
class Task:
    """One state attempt handed to a handler."""

    message: StateTask
    _send: Callable[[dict[str, Any]], None] = field(repr=False)
    _slot: Slot | None = field(default=None, repr=False)
    # why its last answer was refused (by the engine, or by the contract checked here before
    # sending): [{"pointer", "message"}]; empty on the first run
    problems: Problems = field(default_factory=list)

    def __post_init__(self) -> None:
        if self._slot is not None and not self.problems:
            self.problems = list(self._slot.problems)

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
    def output_schema(self) -> dict[str, Any] | None:
        """The JSON Schema the answer must match (None: the engine sent none)."""
        return self.message.output_schema

    def flaws(self, output: Mapping[str, Any]) -> Problems:
        """How the output breaks the task's contract, as the engine would name it."""
        schema = self.message.output_schema
        return [f.to_json() for f in flaws(schema, output)] if schema else []

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


Handler = Callable[["Task"], Mapping[str, Any] | Awaitable[Mapping[str, Any]]]


class NoAck(Exception):
    """Raised by a handler to send no ack at all (the state will time out)."""


class HandBack(Exception):
    """Raised by a handler to give the attempt back (`state_handback`): sent again at once, to
    another agent if one is live, without counting a retry (past `max_handbacks` in a row, a
    failure)."""


class Failed(Exception):
    """Raised by a handler to answer the attempt as failed, with an output all the same (what
    it spent, `tokensUsed` and `cost`, counts in the machine's usage and budget)."""

    def __init__(self, error: str, output: Mapping[str, Any] | None = None) -> None:
        super().__init__(error)
        self.output = dict(output or {})


SHUTTING_DOWN = "the agent is shutting down"


def run_handler(handler: Handler, task: Task) -> Mapping[str, Any]:
    """The handler's output for the task (an async handler run to its end, cancellably)."""
    output = handler(task)
    if inspect.isawaitable(output):
        output = asyncio.run(cancellable(output, task._slot))
    return output


def handback(task: StateTask) -> dict[str, Any]:
    """The hand-back of a task the agent leaves undone as it stops."""
    return reply(task, "state_handback", reason=SHUTTING_DOWN)


def invalid_task_ack(raw: bytes, exc: ValidationError) -> dict[str, Any] | None:
    """The failed ack naming what is wrong with a state_task that breaks the schema (None when
    there is no attempt to answer: the engine will time it out)."""
    problem = "; ".join(f"{_where(e['loc'])}: {e['msg']}" for e in exc.errors())
    log.error("refusing an invalid task message: %s", problem)
    try:
        data = json.loads(raw)
        ack = {key: data[key] for key in ("machineId", "state", "attempt", "taskToken")}
    except (ValueError, TypeError, KeyError):
        return None
    if data.get("type", "state_task") != "state_task":
        return None  # a cancel (or a newer message) is no attempt to fail
    error = f"invalid state_task: {problem}"
    return {"type": "state_ack", **ack, "success": False, "output": {}, "error": error}


def _where(loc: tuple[int | str, ...]) -> str:
    """An error's location without the message type the union leads it with."""
    if loc and loc[0] in TASK_MESSAGE_TYPES:
        loc = loc[1:]
    return ".".join(map(str, loc)) or "message"


def sample_task(machine_type: str, state: str, context: Mapping[str, Any] | None) -> StateTask:
    """A state_task as the engine would send it, unsigned, for a test without an engine."""
    return StateTask(
        machine_id=uuid.uuid4(),
        machine_type=machine_type,
        state=state,
        attempt=1,
        context=dict(context or {}),
        prompt="",
        required_output=[],
        timeout=60_000,
        deadline=datetime.now(UTC) + timedelta(minutes=1),
        task_token="not-signed",
    )
