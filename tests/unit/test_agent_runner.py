"""run_agents, the process edge of every agent: an agent that dies of an error stops the
others and makes the process exit 1, never 0 (a supervisor restarting only what failed would
otherwise leave it down)."""

from __future__ import annotations

import signal
import threading
from collections.abc import Iterator
from typing import Any, cast

import pytest

from fsm_celery.agent.runner import run_agents


@pytest.fixture(autouse=True)
def _signals_kept() -> Iterator[None]:
    """run_agents installs its SIGINT and SIGTERM handlers: pytest's are put back."""
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    yield
    for sig, handler in kept.items():
        signal.signal(sig, handler)


class _Agent:
    def __init__(self, name: str, fails: bool) -> None:
        self.id, self.fails = name, fails
        self.stopped = threading.Event()

    def run(self, install_signals: bool = True) -> None:
        if self.fails:
            raise RuntimeError("UNBLOCKED the stream key no longer exists")
        self.stopped.wait(30)

    def stop(self) -> None:
        self.stopped.set()


def test_an_agent_that_died_stops_the_others_and_the_process_exits_1() -> None:
    serving, dying = _Agent("a", fails=False), _Agent("b", fails=True)
    with pytest.raises(SystemExit) as exited:
        run_agents(cast(Any, [serving, dying]))
    assert exited.value.code == 1
    assert serving.stopped.is_set()


def test_agents_stopped_by_a_signal_end_the_process_normally() -> None:
    agents = [_Agent("a", fails=False), _Agent("b", fails=False)]
    threading.Timer(0.2, lambda: [a.stop() for a in agents]).start()
    run_agents(cast(Any, agents))  # returns: the process exits 0
