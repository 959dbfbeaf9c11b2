"""The pure core imports with Redis, SQLAlchemy, Celery and the web stack missing (run in a
fresh interpreter in which importing any of them fails)."""

from __future__ import annotations

import subprocess
import sys

BLOCKED = (
    "redis",
    "sqlalchemy",
    "celery",
    "kombu",
    "psycopg2",
    "alembic",
    "fastapi",
    "starlette",
    "httpx",
)

PROGRAM = f"""
import importlib.abc, sys

class Missing(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {BLOCKED!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked)")
        return None

sys.meta_path.insert(0, Missing())
import fsm_celery.core.transition, fsm_celery.core.messages, fsm_celery.core.loader
import fsm_celery.core.admin, fsm_celery.core.intake, fsm_celery.core.retry
import fsm_celery.core.usage, fsm_celery.core.prompt, fsm_celery.core.graph
import fsm_celery.core.stats, fsm_celery.core.github, fsm_celery.core.notify
from fsm_celery import MachineStatus, FsmError
assert not [m for m in sys.modules if m.split(".")[0] in {BLOCKED!r}]
try:
    import redis
except ModuleNotFoundError:
    print("core imported; redis blocked")
"""


def test_the_core_imports_without_redis_sqlalchemy_or_celery() -> None:
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "core imported; redis blocked"
