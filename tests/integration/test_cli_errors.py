"""A user's mistake or an unreachable service: one line on stderr, a documented exit status, no
traceback (unless -v). Each case runs through the real `fsm-celery` entry point."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

import pytest
from sqlalchemy.engine import make_url

from tests.support.processes import FsmEnv

FSM_CELERY = str(Path(sys.executable).parent / "fsm-celery")
MACHINE = "00000000-0000-4000-8000-000000000000"


class Case(NamedTuple):
    args: tuple[str, ...]
    env: dict[str, str]
    status: int
    says: tuple[str, ...]


@pytest.fixture(scope="module")
def deployment(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    return env_factory("cli_errors")


def _run(
    deployment: FsmEnv, args: tuple[str, ...], env: dict[str, str], cwd: Path | None = None
) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in deployment.env.items() if not k.startswith("FSM_")}
    base.update(
        FSM_DATABASE_URL=deployment.settings.database_url,
        FSM_REDIS_URL=deployment.settings.redis_url,
        FSM_TASK_TOKEN_SECRET=deployment.settings.task_token_secret,
    )
    return subprocess.run(
        [FSM_CELERY, *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        cwd=cwd,
    )


def _cases(deployment: FsmEnv, tmp: Path) -> dict[str, Case]:
    url = make_url(deployment.settings.database_url)
    bare = f"{url.username}@{url.host}:{url.port}/{url.database}"
    not_utf8 = tmp / "latin1.yaml"
    not_utf8.write_bytes("type: caf\xe9\n".encode("latin-1"))
    deep = "[" * 5000 + "]" * 5000
    broken = tmp / "broken.yaml"
    broken.write_text("type: broken\nstates: [\n  - name: A\n")
    return {
        "missing definitions folder": Case(
            ("definitions", "validate", "/nonexistent/defs"),
            {},
            3,
            ("/nonexistent/defs", "cannot read"),
        ),
        "FSM_DEFINITIONS_PATH missing": Case(
            ("definitions", "load"),
            {"FSM_DEFINITIONS_PATH": "/nonexistent/defs"},
            3,
            ("/nonexistent/defs", "cannot read"),
        ),
        "garbage database URL": Case(
            ("list",), {"FSM_DATABASE_URL": "not a url"}, 3, ("FSM_DATABASE_URL", "postgresql://")
        ),
        "unreachable database, password masked": Case(
            ("list",),
            {"FSM_DATABASE_URL": "postgresql://fsm:hunter2@127.0.0.1:1/fsm"},
            4,
            ("cannot reach the database", "fsm:***@127.0.0.1:1", "FSM_DATABASE_URL"),
        ),
        "http Redis URL": Case(
            ("agents", "list"),
            {"FSM_REDIS_URL": "http://127.0.0.1:6379"},
            3,
            ("FSM_REDIS_URL", "redis://"),
        ),
        "unreachable Redis, password masked": Case(
            ("rejected", "--parked"),
            {"FSM_REDIS_URL": "redis://:hunter2@127.0.0.1:1/0"},
            4,
            ("cannot reach Redis", ":***@127.0.0.1:1"),
        ),
        "FSM_MAX_PAYLOAD_BYTES=abc": Case(
            ("list",), {"FSM_MAX_PAYLOAD_BYTES": "abc"}, 3, ("FSM_MAX_PAYLOAD_BYTES", "'abc'")
        ),
        "context nested 5,000 deep": Case(
            ("start", "cto_fix_bug", "--context", deep), {}, 2, ("--context", "nested")
        ),
        "non-UTF-8 definition": Case(
            ("definitions", "validate", str(not_utf8)), {}, 3, (str(not_utf8), "UTF-8")
        ),
        "YAML syntax error": Case(
            ("definitions", "validate", str(broken)),
            {},
            3,
            (f"{broken}:3:3: invalid YAML: expected the node content",),
        ),
        "wrong --app module": Case(
            ("agent", "--app", "nosuchmodule:agent"), {}, 2, ("--app", "cannot import")
        ),
        "wrong --app attribute": Case(
            ("agent", "--app", "fsm_celery:nosuch"), {}, 2, ("--app", "no attribute 'nosuch'")
        ),
        "--limit -1": Case(("list", "--limit", "-1"), {}, 2, ("--limit", "-1")),
        "--tokens 2**63": Case(
            ("budget", MACHINE, "--tokens", str(2**63)), {}, 2, ("--tokens", str(2**63))
        ),
        "over-long --actor": Case(
            ("pause", MACHINE, "--actor", "a" * 101), {}, 2, ("--actor", "at most 100")
        ),
        "unknown machine": Case(("status", MACHINE), {}, 1, ("no machine with id",)),
        "postgresql:// works": Case(
            ("list", "--limit", "1"), {"FSM_DATABASE_URL": f"postgresql://{bare}"}, 0, ()
        ),
        "postgres:// works": Case(
            ("list", "--limit", "1"), {"FSM_DATABASE_URL": f"postgres://{bare}"}, 0, ()
        ),
    }


CASES = [
    "missing definitions folder",
    "FSM_DEFINITIONS_PATH missing",
    "garbage database URL",
    "unreachable database, password masked",
    "http Redis URL",
    "unreachable Redis, password masked",
    "FSM_MAX_PAYLOAD_BYTES=abc",
    "context nested 5,000 deep",
    "non-UTF-8 definition",
    "YAML syntax error",
    "wrong --app module",
    "wrong --app attribute",
    "--limit -1",
    "--tokens 2**63",
    "over-long --actor",
    "unknown machine",
    "postgresql:// works",
    "postgres:// works",
]


@pytest.mark.parametrize("name", CASES)
def test_an_error_is_one_line_naming_what_was_wrong(
    name: str, deployment: FsmEnv, tmp_path: Path
) -> None:
    case = _cases(deployment, tmp_path)[name]
    done = _run(deployment, case.args, case.env, cwd=tmp_path)
    assert done.returncode == case.status, done.stdout + done.stderr
    assert "Traceback" not in done.stdout + done.stderr
    assert "hunter2" not in done.stdout + done.stderr
    if case.status == 0:
        return
    message = done.stderr.strip()
    if case.status != 2:  # click's usage errors add a usage line and a hint
        assert "\n" not in message, message
    for words in case.says:
        assert words in message, message


def test_verbose_adds_the_traceback(deployment: FsmEnv, tmp_path: Path) -> None:
    done = _run(
        deployment, ("-v", "list"), {"FSM_DATABASE_URL": "postgresql://x@127.0.0.1:1/x"}, tmp_path
    )
    assert done.returncode == 4
    assert "Traceback" in done.stderr
    assert done.stderr.strip().splitlines()[-1].startswith("error: cannot reach the database")


def test_the_exit_statuses_are_documented() -> None:
    done = subprocess.run([FSM_CELERY, "--help"], capture_output=True, text=True, check=True)
    text = " ".join(done.stdout.split())
    assert "Exit status: 0 done, 1 the operation failed, 2 wrong usage, 3 bad configuration" in text
    assert os.path.exists(FSM_CELERY)
