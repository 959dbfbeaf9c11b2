"""A new user's first minutes: `pip install <checkout>` into a fresh virtualenv outside the
repository, then `fsm-celery demo` runs to its summary with no service configured, and
`fsm-celery init` writes a deployment folder. The virtualenv borrows this one's pip, setuptools
and runtime dependencies (a .pth file) so that the test needs no network; fsm-celery itself is
built and installed from the checkout, not linked to it."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(argv: list[str | Path], cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, f"{argv}:\n{done.stdout}\n{done.stderr}"
    assert "Traceback" not in done.stderr, done.stderr
    return done.stdout


def test_pip_install_then_demo_and_init_work_outside_the_repository(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("FSM_", "PYTHON"))}
    env["FSM_DATABASE_URL"] = "postgresql://nobody:secret@127.0.0.1:1/none"  # must not be used
    env["FSM_REDIS_URL"] = "redis://127.0.0.1:1/0"  # must not be used
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv], tmp_path, env)
    [site] = (venv / "lib").glob("python3*/site-packages")
    (site / "borrowed.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    pip = [venv / "bin" / "python", "-m", "pip", "install", "--quiet", "--no-deps"]
    _run([*pip, "--no-build-isolation", "--no-index", ROOT], tmp_path, env)
    fsm_celery = venv / "bin" / "fsm-celery"
    located = _run(
        [venv / "bin" / "python", "-c", "import fsm_celery; print(fsm_celery.__file__)"],
        tmp_path,
        env,
    )
    assert located.startswith(str(site)), located  # the installed copy, not the checkout

    out = _run([fsm_celery, "demo"], tmp_path, env)
    summary = out[out.index("Summary") :]
    assert summary.count("│ completed │") == 5, out

    _run([fsm_celery, "init", "site"], tmp_path, env)
    written = sorted(p.name for p in (tmp_path / "site" / "definitions").iterdir())
    assert written == [
        "cto_build_project.yaml",
        "cto_fix_bug.yaml",
        "cto_infrastructure_check.yaml",
        "research_pipeline.yaml",
    ]
    dotenv = (tmp_path / "site" / ".env").read_text()
    assert "\nFSM_DEFINITIONS_PATH=definitions\n" in dotenv  # read from the folder
    secret = next(line for line in dotenv.splitlines() if line.startswith("FSM_TASK_TOKEN_SECRET"))
    assert len(secret.split("=", 1)[1]) == 64
    assert oct((tmp_path / "site" / ".env").stat().st_mode)[-3:] == "600"
    checked = _run([fsm_celery, "definitions", "validate", "site/definitions"], tmp_path, env)
    assert checked.count("ok  ") == 4


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
