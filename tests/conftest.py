"""Shared test configuration: the services the tests talk to (tests/support/services.py).

Run with xdist (`pytest -n N`), each worker starts servers of its own and the controller, which
runs no test, none."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.support.credentials import TEST_SECRET
from tests.support.databases import create_template, drop_database
from tests.support.processes import FsmEnv, database_name, make_env
from tests.support.services import Services, require_services

# Started by pytest_configure, before any test runs: the suite's own PostgreSQL and Redis unless
# the environment names others (tests/support/services.py). Tests reach them through the fixture
# below.
_services: Services | None = None
EXISTING_SERVERS = ("FSM_TEST_DATABASE_URL", "FSM_TEST_REDIS_URL")
TEMPLATE = f"fsm_test_template_{os.getpid()}"

# No fsm_celery process of the suite may fall back on the default Redis or secret.
os.environ.pop("FSM_BROKER_URL", None)
os.environ["FSM_TASK_TOKEN_SECRET"] = TEST_SECRET


def _needs_services(config: pytest.Config) -> bool:
    """Only the pure unit tests run without servers."""
    unit = Path(__file__).parent / "unit"
    paths = [config.invocation_params.dir / arg.split("::")[0] for arg in config.args]
    return not paths or not all(p.resolve().is_relative_to(unit) for p in paths)


def _xdist_controller(config: pytest.Config) -> bool:
    """The xdist process that hands tests to the workers (and runs none itself)."""
    distributing = config.getoption("dist", "no") != "no"
    return distributing and not hasattr(config, "workerinput")


def _refuse_shared_servers() -> None:
    """Servers the environment names would be every xdist worker's, and some tests change a
    server as a whole: they would do it under each other's feet."""
    given = [name for name in EXISTING_SERVERS if os.environ.get(name)]
    if given:
        raise pytest.UsageError(
            f"{' and '.join(given)} {'name' if len(given) > 1 else 'names'} servers that every "
            "xdist worker would share, and some tests change a server as a whole (roles, ACL "
            "users, FLUSHALL): run on them in one process (-n 0), or unset them for servers "
            "of each worker's own"
        )


def pytest_configure(config: pytest.Config) -> None:
    global _services
    if _xdist_controller(config):
        if _needs_services(config):
            _refuse_shared_servers()
        return
    if not _needs_services(config):
        os.environ["FSM_REDIS_URL"] = "redis://127.0.0.1:1/0"  # nothing may use it
        return
    _services = Services.start()
    os.environ["FSM_REDIS_URL"] = _services.redis_url


def pytest_unconfigure(config: pytest.Config) -> None:
    if _services is not None:
        _services.stop()


@pytest.fixture(scope="session")
def services() -> Services:
    """The PostgreSQL server URL (no database name) and the Redis URL of this run."""
    if _services is None:
        pytest.fail("the unit tier has no services: run this test with the others")
    return _services


# The deployments (tests/support/processes.py), here as the integration, browser and in-process
# tiers all make them: one template and one factory per test process, whichever tiers it runs.
# A deployment lives as long as the test file that made it (its worker's beat sends tasks every
# second, its bridge reads: left running, a process's idle deployments added up, file after
# file, on two cores), the shared ones of tests/integration/conftest.py for the session.
_made: list[FsmEnv] = []
_session_lived: set[int] = set()


@pytest.fixture(scope="session")
def template_db(services: Services) -> Iterator[str]:
    require_services(services.pg_url, services.redis_url)
    redis.Redis.from_url(services.redis_url).flushdb()
    create_template(services.pg_url, TEMPLATE)
    yield TEMPLATE
    drop_database(services.pg_url, TEMPLATE)


@pytest.fixture(scope="session")
def env_factory(services: Services, template_db: str) -> Iterator[Callable[..., FsmEnv]]:
    """make_env's deployments, each started as the test asks (start_worker, start_bridge, ...),
    stopped and its database dropped once its test file has run (session=True: at the end of
    the session)."""

    def factory(name: str, *, session: bool = False, **overrides: object) -> FsmEnv:
        redis_url = str(overrides.pop("redis_url", services.redis_url))
        env = make_env(name, services.pg_url, template_db, redis_url, **overrides)
        _made.append(env)
        if session:
            _session_lived.add(id(env))
        return env

    yield factory
    _remove(list(_made), services)


@pytest.fixture(scope="module", autouse=True)
def _deployments_of_the_file() -> Iterator[None]:
    """Stops the deployments the file made (after its own fixtures' teardown)."""
    before = len(_made)
    yield
    made = [env for env in _made[before:] if id(env) not in _session_lived]
    if made and _services is not None:
        _remove(made, _services)


def _remove(envs: list[FsmEnv], services: Services) -> None:
    for env in envs:  # all asked to stop at once, then waited for
        for proc in env.procs:
            proc.terminate()
    for env in envs:
        env.stop_all()
        env.client.engine.db.dispose()
        drop_database(services.pg_url, database_name(env))
        _made.remove(env)
        _session_lived.discard(id(env))
