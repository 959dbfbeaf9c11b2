"""A new user's first minutes: `pip install` of the wheel built from the checkout into a fresh
virtualenv outside the repository, then `fsm-celery demo` runs to its summary with no service
configured, `fsm-celery init` writes a deployment folder, and `fsm-celery definitions load`
with no path stores the definitions the wheel carries. The virtualenv borrows this one's pip,
hatchling and runtime dependencies (a .pth file) so that the test needs no network; fsm-celery
itself is built and installed from the checkout, not linked to it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.support.databases import drop_database
from tests.support.services import Services

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = [
    "cto_build_parallel",
    "cto_build_project",
    "cto_fix_bug",
    "cto_infrastructure_check",
    "research_fanout",
    "research_pipeline",
]


def _run(argv: list[str | Path], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


@dataclass(frozen=True)
class Installed:
    """A fresh virtualenv with fsm-celery installed from its wheel, and a folder to run it in."""

    site: Path
    bin: Path
    cwd: Path
    env: dict[str, str]  # no FSM_ setting but servers that must not be used

    def run(self, *argv: str | Path, **env: str) -> str:
        return _run([self.bin / argv[0], *argv[1:]], self.cwd, {**self.env, **env})


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    tmp_path = tmp_path_factory.mktemp("fresh")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSM_", "PYTHON"))}
    env["FSM_DATABASE_URL"] = "postgresql://nobody:secret@127.0.0.1:1/none"  # must not be used
    env["FSM_REDIS_URL"] = "redis://127.0.0.1:1/0"  # must not be used
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env)
    [site] = (venv / "lib").glob("python3*/site-packages")
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [venv / "bin" / "python", "-m", "pip", "--quiet"]
    _run(
        [*pip, "wheel", "--no-deps", "--no-build-isolation", "--no-index", "-w", "dist", ROOT],
        tmp_path,
        env,
    )
    [wheel] = (tmp_path / "dist").glob("fsm_celery-*.whl")
    _run([*pip, "install", "--no-deps", "--no-index", wheel], tmp_path, env)
    (tmp_path / "work").mkdir()
    return Installed(site, venv / "bin", tmp_path / "work", env)


def test_the_installed_package_reads_the_definitions_it_carries(installed: Installed) -> None:
    located = installed.run(
        "python",
        "-c",
        "import fsm_celery; from fsm_celery.core.loader import SHIPPED_DEFINITIONS as S; "
        "print(fsm_celery.__file__); print(S)",
    ).split()
    package = installed.site / "fsm_celery"
    assert located == [str(package / "__init__.py"), str(package / "definitions")]
    checked = installed.run("fsm-celery", "definitions", "validate")  # no path: the shipped ones
    assert [line.split()[1] for line in checked.splitlines()] == SHIPPED


def test_definitions_load_with_no_path_stores_the_shipped_ones(
    installed: Installed, services: Services
) -> None:
    name = f"fsm_fresh_install_{os.getpid()}"
    database = f"{services.pg_url}/{name}"
    drop_database(services.pg_url, name)
    try:
        settings = {"FSM_DATABASE_URL": database, "FSM_REDIS_URL": services.redis_url}
        installed.run("fsm-celery", "db", "upgrade", "--create", **settings)
        loaded = installed.run("fsm-celery", "definitions", "load", **settings)
        assert [line.split() for line in loaded.splitlines()] == [["new", t, "v1"] for t in SHIPPED]
        again = installed.run("fsm-celery", "definitions", "load", **settings)
        assert [line.split() for line in again.splitlines()] == [["same", t, "v1"] for t in SHIPPED]
    finally:
        drop_database(services.pg_url, name)


def test_demo_and_init_work_outside_the_repository(installed: Installed) -> None:
    out = installed.run("fsm-celery", "demo")
    summary = out[out.index("Summary") :]
    # and a second build, a second research pipeline worked by the LLM agent (its tokens), and
    # a second bug fix worked over MCP (the mcp extra is among the borrowed dependencies)
    assert summary.count("│ completed │") == len(SHIPPED) + 3, out
    [llm] = [line.split("│") for line in summary.splitlines() if "research_pipeline#8" in line]
    assert int(llm[5]) > 0, out

    installed.run("fsm-celery", "init", "site")
    site = installed.cwd / "site"
    written = sorted(p.name for p in (site / "definitions").iterdir())
    assert written == [f"{t}.yaml" for t in SHIPPED]
    dotenv = (site / ".env").read_text()
    assert "\nFSM_DEFINITIONS_PATH=definitions\n" in dotenv  # read from the folder
    secret = next(line for line in dotenv.splitlines() if line.startswith("FSM_TASK_TOKEN_SECRET"))
    assert len(secret.split("=", 1)[1]) == 64
    assert oct((site / ".env").stat().st_mode)[-3:] == "600"
    checked = installed.run("fsm-celery", "definitions", "validate", "site/definitions")
    assert checked.count("ok  ") == len(SHIPPED)


def test_init_refuses_to_overwrite_without_force(tmp_path: Path) -> None:
    fsm_celery = [sys.executable, "-m", "fsm_celery"]
    _run([*fsm_celery, "init", tmp_path], tmp_path, dict(os.environ))
    before = (tmp_path / ".env").read_text()
    refused = subprocess.run(
        [*fsm_celery, "init", str(tmp_path)], capture_output=True, text=True, timeout=60
    )
    assert refused.returncode == 1
    assert refused.stderr.startswith("error: ") and "pass --force" in refused.stderr
    assert (tmp_path / ".env").read_text() == before  # nothing changed
    _run([*fsm_celery, "init", "--force", tmp_path], tmp_path, dict(os.environ))
    assert (tmp_path / ".env").read_text() != before  # a new secret
