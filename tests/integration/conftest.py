"""Fixtures for integration tests: real PostgreSQL, Redis, Celery worker and ack bridge."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator

import pytest
import redis

from tests.conftest import TEST_PG_URL, TEST_REDIS_URL
from tests.integration.harness import (
    FsmEnv,
    create_template,
    database_name,
    drop_database,
    make_env,
    require_services,
)

TEMPLATE = f"fsm_test_template_{os.getpid()}"


@pytest.fixture(scope="session")
def template_db() -> Iterator[str]:
    require_services(TEST_PG_URL, TEST_REDIS_URL)
    redis.Redis.from_url(TEST_REDIS_URL).flushdb()
    create_template(TEST_PG_URL, TEMPLATE)
    yield TEMPLATE
    drop_database(TEST_PG_URL, TEMPLATE)


@pytest.fixture(scope="session")
def env_factory(template_db: str) -> Iterator[Callable[..., FsmEnv]]:
    made: list[FsmEnv] = []

    def factory(name: str, **overrides: object) -> FsmEnv:
        redis_url = str(overrides.pop("redis_url", TEST_REDIS_URL))
        env = make_env(name, TEST_PG_URL, template_db, redis_url, **overrides)
        made.append(env)
        return env

    yield factory
    for env in made:
        env.stop_all()
        env.client.engine.db.dispose()
        drop_database(TEST_PG_URL, database_name(env))


@pytest.fixture(scope="session", params=["celery", "inline"])
def mode(request: pytest.FixtureRequest) -> str:
    """The transition mode (FSM_TRANSITION_MODE): every test on a deployment that takes it
    runs once with the acks applied by fsm.apply_acks tasks, and once by the bridge inline."""
    return str(request.param)


@pytest.fixture(scope="session")
def fsm(env_factory: Callable[..., FsmEnv], mode: str) -> FsmEnv:
    """The shared deployment of the mode: one worker and one ack bridge."""
    env = env_factory(f"shared_{mode}", transition_mode=mode)
    env.start_worker()
    env.start_bridge()
    return env
