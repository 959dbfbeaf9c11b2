"""Shared test configuration: the services the integration tests talk to."""

from __future__ import annotations

import os

from tests.secret import TEST_SECRET

# Set before any fsm_celery module reads its settings: every process of the suite uses the
# test Redis database, never the default one.
TEST_REDIS_URL = os.environ.get("FSM_TEST_REDIS_URL", "redis://127.0.0.1:6379/14")
TEST_PG_URL = os.environ.get("FSM_TEST_PG_URL", "postgresql+psycopg2://postgres@127.0.0.1:5432")
os.environ["FSM_REDIS_URL"] = TEST_REDIS_URL
os.environ.pop("FSM_BROKER_URL", None)
os.environ["FSM_TASK_TOKEN_SECRET"] = TEST_SECRET
