"""`fsm-celery doctor` against a real deployment: each check fails once, then all pass."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import select

from fsm_celery.core.loader import SHIPPED_DEFINITIONS
from fsm_celery.store import partitions
from fsm_celery.store.db import alembic_config
from fsm_celery.store.tables import liveness
from tests.support.doctor import run_doctor
from tests.support.processes import FsmEnv
from tests.support.services import RedisServer

HEAD = ScriptDirectory.from_config(alembic_config("sqlite://")).get_current_head()


def _doctor(env: FsmEnv, **overrides: str) -> tuple[int, dict[str, str]]:
    """Run the real command; its exit status and each check's line by name."""
    done = run_doctor(env, **overrides)
    assert "Traceback" not in done.stdout + done.stderr, done.stdout + done.stderr
    *checks, watching = done.stdout.splitlines()
    assert "deploy/" in watching and "docs/operations.md" in watching, done.stdout
    lines = {}
    for line in checks:
        name = line[2:].split(":", 1)[0]
        lines[name] = line
    assert set(lines) == {
        "database",
        "redis",
        "broker",
        "definitions",
        "workers",
        "queues",
        "beat",
        "bridges",
        "agents",
        "history",
        "token secret",
        "channel prefix",
    }, done.stdout
    return done.returncode, lines


def test_each_check_fails_with_its_fix_then_all_pass(
    env_factory: Callable[..., FsmEnv], tmp_path: Path
) -> None:
    (tmp_path / "redis").mkdir()
    server = RedisServer(tmp_path / "redis", "--maxmemory-policy", "allkeys-lru")
    try:
        env = env_factory("doctor", redis_url=server.url)
        changed = tmp_path / "definitions"
        shutil.copytree(SHIPPED_DEFINITIONS, changed)
        infra = changed / "cto_infrastructure_check.yaml"
        infra.write_text(infra.read_text().replace("timeout: 300", "timeout: 301", 1))
        coming = partitions.next_month(partitions.month(datetime.now(UTC)))
        with env.client.engine.db.connect() as conn:  # beat has not made next month's
            [month] = [p for p in partitions.listed(conn, partitions.HISTORY) if p.start == coming]
        partitions.detach(env.client.engine.db, month)
        partitions.drop(env.client.engine.db, month.name)

        status, lines = _doctor(
            env,
            FSM_DEFINITIONS_PATH=str(changed),
            FSM_TASK_TOKEN_SECRET="change-me-in-production",
        )
        assert status == 1
        assert (
            lines["database"].startswith("✔ database:") and f"at head ({HEAD})" in lines["database"]
        )
        assert lines["redis"].startswith("✘ redis: maxmemory-policy is allkeys-lru")
        assert "noeviction" in lines["redis"]
        queue = env.settings.queue  # Celery's broker is FSM_REDIS_URL: named, its queues counted
        assert lines["broker"].startswith(f"✔ broker: Redis at {server.url}, reachable;")
        assert f"{queue} 0, {queue}.housekeeping 0" in lines["broker"], lines["broker"]
        assert lines["definitions"].startswith("✘ definitions: cto_infrastructure_check")
        assert lines["definitions"].endswith("run: fsm-celery definitions load")
        assert lines["workers"].startswith("✘ workers: none answered")
        assert lines["queues"].startswith("✘ queues: no worker answered")
        assert lines["beat"] == "✘ beat: no scan ever ran — start it: celery -A fsm_celery beat"
        assert lines["bridges"].startswith("✘ bridges: none alive; ack stream lag 0, pending 0")
        assert lines["token secret"].startswith("✘ token secret: FSM_TASK_TOKEN_SECRET is the")
        assert lines["history"] == (
            f"✘ history: state_transitions has no partition for {coming:%Y-%m}: what is written "
            "then fails — start beat (its hourly job makes them), or run: fsm-celery history "
            "months --make"
        )
        assert lines["agents"].startswith(
            "✘ agents: none alive for agent type analyzer (research_fanout, research_pipeline); "
            "cto (cto_build_parallel, cto_build_project, cto_fix_bug, cto_infrastructure_check); "
            "docwriter (cto_build_parallel, "
        )
        # the types of definitions loaded in the database and not in the folder (the tests')
        assert "; writer (test_fan_parallel, test_fan_step, test_fan_ten)" in lines["agents"]
        assert (
            "start one: fsm-celery agent --mock --agent-type analyzer --agent-type cto "
            "--agent-type docwriter --agent-type limited --agent-type researcher "
            "--agent-type reviewer --agent-type tester --agent-type writer" in (lines["agents"])
        ), lines["agents"]

        server_client = env.redis.__class__.from_url(server.url)
        server_client.config_set("maxmemory-policy", "noeviction")
        server_client.close()
        made = subprocess.run(
            [str(Path(sys.executable).parent / "fsm-celery"), "history", "months", "--make"],
            env=env.env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert made.returncode == 0 and f"{coming:%Y-%m} made" in made.stderr, made
        env.start_worker(beat=True)
        env.start_bridge()
        env.start_agent("--mock", "--agent-type", "cto")
        env.wait_for_agents(1)
        _wait_for_scan(env)
        status, lines = _doctor(env)
        assert status == 1  # nothing serves the research pipelines, nor the build's branches
        assert lines["agents"].startswith("✘ agents: none alive for agent type analyzer ")
        others = ("analyzer", "docwriter", "limited", "researcher", "reviewer", "tester", "writer")
        env.start_agent("--mock", *(flag for t in others for flag in ("--agent-type", t)))
        env.wait_for_agents(1 + len(others))
        status, lines = _doctor(env)
        assert status == 0, lines
        assert all(line.startswith("✔") for line in lines.values()), lines
        assert "1 answering" in lines["workers"] and "1 alive" in lines["bridges"]
        assert lines["agents"] == (
            "✔ agents: alive for every agent type (analyzer 1, cto 1, docwriter 1, limited 1, "
            "researcher 1, reviewer 1, tester 1, writer 1)"
        )

        env.stop_all()
        status, lines = _doctor(
            env, FSM_DATABASE_URL=env.settings.database_url.replace(f":{_port(env)}/", ":1/")
        )
        assert status == 1
        assert "Connection refused" in lines["database"]
        assert lines["database"].endswith("check FSM_DATABASE_URL and that PostgreSQL runs")

        command.downgrade(alembic_config(env.settings.database_url), "0006")
        status, lines = _doctor(env)
        assert lines["database"].startswith("✘ database:")
        assert f"is at migration 0006, the code needs {HEAD}" in lines["database"]
        assert lines["database"].endswith("run: fsm-celery db upgrade")

        command.downgrade(alembic_config(env.settings.database_url), "base")
        status, lines = _doctor(env)
        for name in ("definitions", "beat"):  # checks that read tables name the migration
            assert lines[name].startswith(f"✘ {name}: the schema is missing (relation "), lines
            assert lines[name].endswith("run: fsm-celery db upgrade"), lines
    finally:
        server.stop()


def _port(env: FsmEnv) -> int:
    from sqlalchemy.engine import make_url

    return int(make_url(env.settings.database_url).port or 5432)


def _wait_for_scan(env: FsmEnv, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while True:
        with env.client.engine.db.connect() as conn:
            if conn.execute(select(liveness.c.at).where(liveness.c.name == "scan")).first():
                return
        assert time.monotonic() < deadline, "beat's scan never ran"
        time.sleep(0.2)
