"""The path of one ack, traced: an agent's state_ack read from the ack stream by a bridge built
as `fsm-celery ack-bridge` builds it, until the next state's state_task is dispatched, in each
transition mode, in this process (the celery mode's fsm.apply_acks and fsm.enter_state tasks
run here, as a worker runs them). sys.setprofile records each module of fsm_celery entered on
the way, core/ and store/ aside (the pure decisions, and the SQL and write-set the engine
calls in its transaction), and traces/ (OpenTelemetry's spans: off, a check of one global).

A module is entered by a call from another module. A generator resumed (the end of a `with`
block, which runs the rest of its context manager's call) continues the call that entered it:
it is not an entry. Each process on the path is traced apart: the bridge, and in the celery
mode each task, as a worker runs it (a module each of them enters is entered once in each).

README's "The path of one ack" lists are this test's output: `make docs` writes them
(FSM_WRITE_DOCS=1), and here they must match.
"""

from __future__ import annotations

import json
import os
import re
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from types import FrameType
from typing import Any

import pytest

from fsm_celery import wiring
from fsm_celery.acks.bridge import Bridge
from fsm_celery.config import TransitionMode
from fsm_celery.core.messages import ack_stream
from fsm_celery.worker import tasks
from fsm_celery.worker.enqueue import Enqueue
from tests.inprocess.conftest import Agent, Fsm, ack

MOST_MODULES = 8  # that one process's part of the path may enter
COMPOSITION_ROOT = "fsm_celery.wiring"
README = Path(__file__).resolve().parents[2] / "README.md"
# What each module does on the path (a module not named here is listed by its docstring).
ROLES = {
    "fsm_celery.acks.streams": "reads a batch from the agents' ack streams",
    "fsm_celery.acks.bridge": "holds the batch until it is handled",
    "fsm_celery.acks.relay": "sends the batch as an `fsm.apply_acks` task",
    "fsm_celery.worker.tasks": "runs the task",
    "fsm_celery.worker.parts": "the worker's parts the task runs on",
    "fsm_celery.worker.combine": "gathers the tasks running meanwhile into one transaction",
    "fsm_celery.worker.enqueue": "sends an `fsm.enter_state` task per state decided",
    "fsm_celery.engine.inbox": "applies the batch in one transaction (a message that breaks it "
    "isolated): checks each message's sender and token, decides its transition, records it in "
    "the write-set",
    "fsm_celery.engine.entry": "ends the transaction: enters what is due, as its kind does, "
    "sends the state_tasks, writes the write-set",
    "fsm_celery.engine.runtime": "runs the transaction, and once it committed announces its "
    "transitions",
    "fsm_celery.engine.kinds.agent": "builds and routes the agent state's state_task",
    "fsm_celery.channel.redis": "sends over Redis: a state_task (PUBLISH + XADD), or the "
    "transitions' events",
}


BRIDGE = "the bridge"  # the process that reads the ack; in the celery mode, then each task's
PROCESS: list[str] = [BRIDGE]  # where the path is now (the innermost last)


class Eager:
    """The Celery app as the bridge and the worker send tasks on it, each task run here at
    once, as a worker would run it (Task.apply), and traced as its own process."""

    @contextmanager
    def producer_or_acquire(self) -> Iterator[None]:
        yield None

    def send_task(self, name: str, args: tuple[Any, ...], **_: Any) -> None:
        task = {task.name: task for task in (tasks.apply_acks, tasks.enter_state)}[name]
        PROCESS.append(name)
        try:
            task.apply(args, throw=True)
        finally:
            PROCESS.pop()


Path_ = dict[str, list[str]]  # per process on the path (in the order reached), its entries


@contextmanager
def tracing() -> Iterator[Path_]:
    """The modules of fsm_celery entered (outside core/ and store/) while in the block, per
    process, up to and with the first dispatch of a state_task (a dispatch of nothing goes on)."""
    entered: Path_ = {}
    seen: set[int] = set()  # the frames called already: another call event is a resumption
    frames: list[FrameType] = []  # kept alive while traced, so that no id is used again
    dispatched = False

    def profile(frame: FrameType, event: str, _: object) -> None:
        nonlocal dispatched
        if event != "call" or dispatched:
            return
        callee = frame.f_globals.get("__name__", "")
        if not callee.startswith("fsm_celery.") or callee.startswith(
            ("fsm_celery.core", "fsm_celery.store", "fsm_celery.traces")  # traces: off, a check
        ):
            return
        if id(frame) in seen:
            return  # a generator resumed: the call that entered it goes on
        seen.add(id(frame))
        frames.append(frame)
        caller = frame.f_back.f_globals.get("__name__", "") if frame.f_back else ""
        if caller != callee:
            entered.setdefault(PROCESS[-1], []).append(callee)
        if frame.f_code.co_name == "dispatch_many" and frame.f_locals.get("messages"):
            dispatched = True

    sys.setprofile(profile)
    try:
        yield entered
    finally:
        sys.setprofile(None)
        frames.clear()


def _bridge(fsm: Fsm, mode: str) -> tuple[Bridge, Callable[[], None]]:
    """A bridge built as `fsm-celery ack-bridge` builds it (in the celery mode, its tasks run
    here, on a worker's parts); and what closes it."""
    settings = fsm.settings.model_copy(update={"transition_mode": TransitionMode(mode)})
    bridge = wiring.ack_bridge(settings, pubsub=False)
    if mode == "inline":
        return bridge, lambda: None
    eager = Eager()
    bridge.handle.app = eager  # type: ignore[attr-defined]
    worker = wiring.provide_worker(settings)
    worker.enqueue = Enqueue(settings, eager)
    return bridge, lambda: worker.engine.db.dispose()


def _one_ack(fsm: Fsm, bridge: Bridge, agent: Agent, traced: bool) -> Path_:
    """Start a machine, ack its first state on the shared ack stream, and have the bridge read
    and handle it; the modules entered, when traced."""
    fsm.start("test_linear")
    task = agent.task()
    fsm.redis.xadd(ack_stream(fsm.settings.channel_prefix), {"message": json.dumps(ack(task))})
    [consumer] = bridge.consumers
    stop = threading.Event()
    with tracing() if traced else _nothing() as entered:
        batch = consumer.read(stop)
        while not batch:
            batch = consumer.read(stop)
        bridge._handle(consumer, batch, stop)
    assert [t["state"] for t in agent.tasks()] == ["TWO"]
    return entered


@contextmanager
def _nothing() -> Iterator[Path_]:
    yield {}


def trace(fsm: Fsm, mode: str) -> Path_:
    """The modules one ack enters in the mode, after a first ack warmed the bridge up (its
    engine, the worker's parts, the stream's consumer group are built on first use)."""
    bridge, close = _bridge(fsm, mode)
    try:
        bridge.consumers[0].open()
        agent = fsm.agent("tester")
        _one_ack(fsm, bridge, agent, traced=False)
        return _one_ack(fsm, bridge, agent, traced=True)
    finally:
        close()


def listing(path: Path_) -> str:
    """The path as README lists it: per process, each module in the order it was first
    entered, with what it does there, and how many times it was entered when more than once."""
    parts = []
    for process, entered in path.items():
        lines = [f"In {process}:\n"] if len(path) > 1 else []
        for n, module in enumerate(dict.fromkeys(entered), 1):
            file = module.removeprefix("fsm_celery.").replace(".", "/")
            file += "/__init__.py" if hasattr(sys.modules[module], "__path__") else ".py"
            times = entered.count(module)
            again = f" (entered {times} times)" if times > 1 else ""
            lines.append(f"{n}. `{file}` {ROLES.get(module) or _summary(module)}{again}\n")
        parts.append("".join(lines))
    return "\n".join(parts)


def _summary(module: str) -> str:
    """The module docstring's first clause."""
    doc = (sys.modules[module].__doc__ or "").strip().replace("\n", " ")
    return re.split(r"[.:;(]", doc, maxsplit=1)[0].strip()


def _markers(mode: str) -> tuple[str, str]:
    return f"<!-- path:{mode}:begin -->\n", f"<!-- path:{mode}:end -->"


def readme_listing(mode: str) -> str:
    begin, end = _markers(mode)
    return README.read_text().partition(begin)[2].partition(end)[0]


def write_listing(mode: str, text: str) -> None:
    begin, end = _markers(mode)
    readme = README.read_text()
    head, _, rest = readme.partition(begin)
    _, _, tail = rest.partition(end)
    README.write_text(head + begin + text + end + tail)


@pytest.mark.parametrize("mode", ["inline", "celery"])
def test_one_ack_crosses_few_modules_once_each_and_never_the_composition_root(
    fsm: Fsm, mode: str
) -> None:
    path = trace(fsm, mode)
    expected = [BRIDGE] if mode == "inline" else [BRIDGE, "fsm.apply_acks", "fsm.enter_state"]
    assert list(path) == expected, path
    for process, entered in path.items():
        assert COMPOSITION_ROOT not in entered, (process, entered)
        assert len(set(entered)) <= MOST_MODULES, (process, entered)
        assert len(entered) == len(set(entered)), (process, entered)  # each entered once
    if os.environ.get("FSM_WRITE_DOCS"):  # make docs
        write_listing(mode, listing(path))
    assert readme_listing(mode) == listing(path)
