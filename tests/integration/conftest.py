"""Fixtures for integration tests: real PostgreSQL, Redis, Celery worker and ack bridge (the
deployments, env_factory, are the suite's: tests/conftest.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from tests.support.processes import FsmEnv
from tests.support.receiver import receiver  # noqa: F401 (a fixture)


@pytest.fixture(scope="session", params=["celery", "inline"])
def mode(request: pytest.FixtureRequest) -> str:
    """The transition mode (FSM_TRANSITION_MODE): every test on a deployment that takes it
    runs once with the acks applied by fsm.apply_acks tasks, and once by the bridge inline,
    unless it is marked ONE_MODE."""
    return str(request.param)


# For a test whose behaviour does not depend on the transition mode: it runs in the default
# mode only. The mode decides how an agent's message reaches the batch applier (in the bridge,
# or in the fsm.apply_acks task the bridge sends) and who enters the state an accepted ack
# leads to; the checks of a well-formed message, heartbeats, the scan's timeouts, delayed
# retries, admin commands and reads are the same code in both. Transport, crashes, batch
# isolation and the states entered after acks keep both modes.
ONE_MODE = pytest.mark.parametrize("mode", ["celery"], indirect=True)


@pytest.fixture(scope="session")
def shared(env_factory: Callable[..., FsmEnv]) -> Callable[[str], FsmEnv]:
    """The shared deployment of a mode, started the first time a test asks for it. Not a
    fixture of the mode: run in parallel, a process takes its tests file by file and the mode
    goes back and forth, which would set up a second deployment of a mode under the first one's
    name, its bridge reading the same acks."""
    made: dict[str, FsmEnv] = {}

    def deployment(mode: str) -> FsmEnv:
        if mode not in made:
            env = env_factory(f"shared_{mode}", transition_mode=mode, session=True)
            env.start_worker()
            env.start_bridge()
            made[mode] = env
        return made[mode]

    return deployment


@pytest.fixture(scope="session")
def fsm(shared: Callable[[str], FsmEnv], mode: str) -> FsmEnv:
    """The shared deployment of the mode: one worker and one ack bridge."""
    return shared(mode)
