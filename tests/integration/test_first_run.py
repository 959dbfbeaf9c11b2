"""A newcomer's first run through the real `fsm-celery` entry point: a database that does not
exist yet is named with the command that creates it (and `db upgrade --create` creates it),
and a definition an author got wrong is one line, however it is wrong."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from sqlalchemy.engine import make_url

from tests.support.databases import admin_sql, drop_database
from tests.support.services import Services

FSM_CELERY = str(Path(sys.executable).parent / "fsm-celery")
# A name that needs quoting: a space, a double quote, capitals.
AWKWARD = 'Fsm new"db'
BILLION_LAUGHS = """\
type: laughs
a: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
b: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
c: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
d: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
e: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
f: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
g: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
h: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
i: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


def _run(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    environ = {k: v for k, v in os.environ.items() if not k.startswith("FSM_")}
    environ.update(FSM_TASK_TOKEN_SECRET=os.environ["FSM_TASK_TOKEN_SECRET"], **env)
    return subprocess.run(
        [FSM_CELERY, *args], env=environ, capture_output=True, text=True, timeout=60
    )


@pytest.fixture
def missing(services: Services) -> tuple[str, str]:
    """A database URL on the test server whose database does not exist (dropped after)."""
    drop_database(services.pg_url, AWKWARD.replace('"', '""'))
    yield f"{services.pg_url}/{AWKWARD}", services.redis_url  # type: ignore[misc]
    drop_database(services.pg_url, AWKWARD.replace('"', '""'))


def test_db_upgrade_on_a_missing_database_says_how_to_create_it(
    missing: tuple[str, str],
) -> None:
    url, redis_url = missing
    done = _run("db", "upgrade", FSM_DATABASE_URL=url, FSM_REDIS_URL=redis_url)
    assert done.returncode == 3  # bad configuration, not "PostgreSQL unreachable"
    [line] = done.stderr.splitlines()
    port = make_url(url).port
    assert line == (
        f"error: database {AWKWARD} does not exist — create it (createdb -h 127.0.0.1 -p "
        f"{port} -U {make_url(url).username} '{AWKWARD}') or let `fsm-celery db upgrade "
        "--create` do it"
    )


def test_doctor_names_the_missing_database_and_the_fix(missing: tuple[str, str]) -> None:
    url, redis_url = missing
    done = _run("doctor", FSM_DATABASE_URL=url, FSM_REDIS_URL=redis_url)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    [database] = [line for line in done.stdout.splitlines() if line.startswith("✘ database:")]
    assert f"database {AWKWARD} does not exist" in database
    assert database.endswith("or run: fsm-celery db upgrade --create")


def test_db_upgrade_create_makes_the_database_then_migrates_it(
    missing: tuple[str, str],
) -> None:
    url, redis_url = missing
    done = _run("db", "upgrade", "--create", FSM_DATABASE_URL=url, FSM_REDIS_URL=redis_url)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"created database {AWKWARD}", "database at head"]
    again = _run("db", "upgrade", "--create", FSM_DATABASE_URL=url, FSM_REDIS_URL=redis_url)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == ["database at head"]  # there already: left as it is
    loaded = _run("definitions", "load", FSM_DATABASE_URL=url, FSM_REDIS_URL=redis_url)
    assert loaded.returncode == 0 and "cto_build_project" in loaded.stdout, loaded.stderr


def test_db_upgrade_create_without_the_privilege_says_who_can(
    services: Services, missing: tuple[str, str]
) -> None:
    url, redis_url = missing
    admin_sql(services.pg_url, "DROP ROLE IF EXISTS fsm_nocreate")
    admin_sql(services.pg_url, "CREATE ROLE fsm_nocreate LOGIN NOCREATEDB")
    try:
        plain = make_url(url).set(username="fsm_nocreate", password=None)
        done = _run(
            "db",
            "upgrade",
            "--create",
            FSM_DATABASE_URL=plain.render_as_string(hide_password=False),
            FSM_REDIS_URL=redis_url,
        )
    finally:
        admin_sql(services.pg_url, "DROP ROLE IF EXISTS fsm_nocreate")
    assert done.returncode == 1
    [line] = done.stderr.splitlines()
    assert line.startswith(f"error: cannot create database {AWKWARD}: permission denied")
    assert line.endswith(f"run createdb -O fsm_nocreate '{AWKWARD}'")


@pytest.mark.parametrize("command", [("definitions", "validate"), ("definitions", "load")])
def test_a_billion_laughs_definition_is_refused_at_once(
    command: tuple[str, str], services: Services, tmp_path: Path
) -> None:
    laughs = tmp_path / "laughs.yaml"
    laughs.write_text(BILLION_LAUGHS)
    done = _run(  # expanded, it would be 9**9 strings: never done within _run's 60 s
        *command,
        str(laughs),
        FSM_DATABASE_URL=f"{services.pg_url}/postgres",
        FSM_REDIS_URL=services.redis_url,
    )
    assert done.returncode == 3
    [line] = done.stderr.splitlines()
    assert line.startswith(f"{laughs}:3:") or line.startswith(f"error: {laughs}:3:"), line
    assert "aliases (*a) are not allowed in definitions" in line


def test_doctor_refuses_a_billion_laughs_in_the_definitions_folder(
    services: Services, tmp_path: Path
) -> None:
    (tmp_path / "laughs.yaml").write_text(BILLION_LAUGHS)
    done = _run(
        "doctor",
        FSM_DATABASE_URL=f"{services.pg_url}/postgres",
        FSM_REDIS_URL=services.redis_url,
        FSM_DEFINITIONS_PATH=str(tmp_path),
    )
    [line] = [x for x in done.stdout.splitlines() if x.startswith("✘ definitions:")]
    assert f"{tmp_path / 'laughs.yaml'}:3:" in line and "aliases" in line


def test_a_yaml_syntax_error_is_one_line_with_its_position(
    services: Services, tmp_path: Path
) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("type: broken\nstates:\n  - name: A\n    prompt: x\n  next: : b\n")
    done = _run(
        "definitions",
        "load",
        str(broken),
        FSM_DATABASE_URL=f"{services.pg_url}/postgres",
        FSM_REDIS_URL=services.redis_url,
    )
    assert done.returncode == 3
    assert done.stderr.splitlines() == [
        f"error: {broken}:5:3: invalid YAML: expected <block end>, but found '?' "
        "(while parsing a block collection started at line 3)"
    ]


@pytest.mark.parametrize("setting", ["FSM_STATE_DIR", "XDG_STATE_HOME"])
def test_beat_keeps_its_schedule_in_the_state_directory(
    setting: str, services: Services, tmp_path: Path
) -> None:
    work, state = tmp_path / "work", tmp_path / "state"
    work.mkdir()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("FSM_", "XDG_"))}
    environ.update(
        FSM_TASK_TOKEN_SECRET=os.environ["FSM_TASK_TOKEN_SECRET"],
        FSM_REDIS_URL=services.redis_url,
        FSM_QUEUE=f"fsm-state-dir-{os.getpid()}",  # nobody consumes what it sends
        **{setting: str(state)},
    )
    # unset, a folder of the deployment's own in $XDG_STATE_HOME/fsm-celery
    expected = state if setting == "FSM_STATE_DIR" else state / "fsm-celery"
    depth = 1 if setting == "FSM_STATE_DIR" else 2
    argv = [sys.executable, "-m", "celery", "-A", "fsm_celery", "beat", "-l", "info"]
    with (tmp_path / "beat.log").open("wb") as log:
        beat = subprocess.Popen(argv, cwd=work, env=environ, stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 30
        while not (found := list(expected.glob("**/celerybeat-schedule*"))):
            assert beat.poll() is None, (tmp_path / "beat.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "beat.log").read_text()
            time.sleep(0.2)
    finally:
        beat.terminate()
        beat.wait(timeout=30)
    assert list(work.iterdir()) == []  # nothing left where it was started
    assert len(found[0].relative_to(expected).parts) == depth, found
