"""`fsm-celery dev`: a PostgreSQL and a Redis for development, in a folder, as the current
user: no sudo, no system service. Only the server binaries are needed (Debian: postgresql,
redis-server; their services may stay stopped).

initdb and postgres refuse to run as root; as root they run as the OS user `postgres` (which
Debian's package creates), on a data folder that user owns, as the test suite's servers do
(tests/support/services.py). Both listen on 127.0.0.1 only; PostgreSQL trusts local
connections (a development server: nothing else can reach it). The settings to use are written
to DIR/env, with a task token secret generated once and kept there.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

from fsm_celery.exceptions import DevStackError

HOST = "127.0.0.1"
PG_PORT, REDIS_PORT = 55432, 56379  # not the system servers' ports, so both can run
START_SECONDS = 60.0
STOP_SECONDS = 30.0  # for both servers together (they stop at once), before SIGKILL
DATABASE = "fsm_celery"


@dataclass(frozen=True)
class Stack:
    """Where the development servers live and listen."""

    directory: Path
    pg_port: int = PG_PORT
    redis_port: int = REDIS_PORT

    @property
    def database_url(self) -> str:
        return f"postgresql://postgres@{HOST}:{self.pg_port}/{DATABASE}"

    @property
    def redis_url(self) -> str:
        return f"redis://{HOST}:{self.redis_port}/0"

    def settings(self) -> dict[str, str]:
        """The FSM_* settings of a deployment on these servers (the secret kept in DIR/env)."""
        kept = _read_env(self.directory / "env")
        return {
            "FSM_DATABASE_URL": self.database_url,
            "FSM_REDIS_URL": self.redis_url,
            "FSM_TASK_TOKEN_SECRET": kept.get("FSM_TASK_TOKEN_SECRET") or secrets.token_hex(32),
            "FSM_STATE_DIR": str(self.directory / "state"),
        }


def start(
    stack: Stack, stopping: Callable[[], bool] = lambda: False
) -> list[subprocess.Popen[bytes]]:
    """Start (after initialising them, the first time) the two servers; their processes,
    PostgreSQL's first. Once `stopping()` is true it starts nothing more and waits for nothing:
    what it started so far is returned, to be stopped."""
    stack.directory.mkdir(parents=True, exist_ok=True)
    started: list[subprocess.Popen[bytes]] = []
    try:
        for begin in (_start_postgres, _start_redis):
            if stopping():
                break
            started.append(begin(stack, stopping))
    except BaseException:
        stop(started)
        raise
    return started


def write_env(stack: Stack) -> Path:
    """DIR/env: the settings as `export` lines, readable by the user alone (a secret)."""
    path = stack.directory / "env"
    lines = [f"export {name}={value}" for name, value in stack.settings().items()]
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write("\n".join(lines) + "\n")
    return path


def stop(processes: list[subprocess.Popen[bytes]]) -> list[str]:
    """Stop the servers with SIGINT (PostgreSQL's fast shutdown; Redis shuts down on it as on
    SIGTERM), both at once. The ones that did not exit within STOP_SECONDS are killed: what
    went wrong with each, none when both stopped."""
    for process in processes:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
    deadline = time.monotonic() + STOP_SECONDS
    problems: list[str] = []
    for process in processes:
        try:
            process.wait(max(deadline - time.monotonic(), 0.0))
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
            problems.append(
                f"{_name(process)} (pid {process.pid}) had not exited {STOP_SECONDS:g} s after "
                "SIGINT: killed (its log is in its folder)"
            )
    return problems


def _name(process: subprocess.Popen[bytes]) -> str:
    argv = process.args
    return Path(str(argv[0] if isinstance(argv, list | tuple) else argv)).name


def _start_postgres(stack: Stack, stopping: Callable[[], bool]) -> subprocess.Popen[bytes]:
    folder = stack.directory / "postgres"
    owner = _owner()
    if not (folder / "data" / "PG_VERSION").exists():
        _init_postgres(folder, owner)
    _free(stack.pg_port, "PostgreSQL")
    argv = [_postgres_bin("postgres"), "-D", str(folder / "data"), "-p", str(stack.pg_port)]
    argv += ["-c", f"listen_addresses={HOST}", "-c", f"unix_socket_directories={folder}"]
    log = folder / "postgres.log"
    with log.open("ab") as out:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=out, **owner)
    _wait(process, log, "PostgreSQL", lambda: _pg_ready(stack), stopping)
    return process


def _init_postgres(folder: Path, owner: Mapping[str, Any]) -> None:
    folder.mkdir(exist_ok=True)
    if owner:  # root: the folder is `postgres`'s, reachable through the folders above it
        folder.parent.chmod(0o755)
        _reachable(folder.parent.resolve())
        shutil.chown(folder, "postgres", "postgres")
    argv = [_postgres_bin("initdb"), "-D", str(folder / "data"), "-U", "postgres"]
    argv += ["-A", "trust", "-E", "UTF8", "--locale=C"]
    done = subprocess.run(argv, capture_output=True, check=False, **owner)
    if done.returncode != 0:
        raise DevStackError("initdb", (done.stdout + done.stderr).decode(errors="replace"))


def _start_redis(stack: Stack, stopping: Callable[[], bool]) -> subprocess.Popen[bytes]:
    binary = shutil.which("redis-server")
    if binary is None:
        raise DevStackError("redis-server", "not on PATH: install it (Debian: redis-server)")
    folder = stack.directory / "redis"
    folder.mkdir(exist_ok=True)
    _free(stack.redis_port, "Redis")
    log = folder / "redis.log"
    argv = [binary, "--port", str(stack.redis_port), "--bind", HOST, "--dir", str(folder)]
    argv += ["--appendonly", "yes", "--maxmemory-policy", "noeviction", "--logfile", str(log)]
    process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    _wait(
        process, log, "Redis", partial(_answers, stack.redis_port, b"PING\r\n", b"+PONG"), stopping
    )
    return process


def _owner() -> dict[str, Any]:
    """Who runs initdb and postgres: this user, or `postgres` for root (they refuse root)."""
    if os.geteuid() != 0:
        return {}
    try:
        found = pwd.getpwnam("postgres")
    except KeyError as exc:
        raise DevStackError(
            "postgres",
            "run as root, PostgreSQL runs as the OS user 'postgres', which does not exist: "
            "install Debian's postgresql package, or run `fsm-celery dev` as another user",
        ) from exc
    return {"user": found.pw_uid, "group": found.pw_gid, "extra_groups": []}


def _reachable(directory: Path) -> None:
    """Refuse a folder the OS user `postgres` cannot reach (a root's home is 0700)."""
    for above in [directory, *directory.parents]:
        if not above.stat().st_mode & 0o001:
            raise DevStackError(
                "postgres",
                f"PostgreSQL runs as the OS user 'postgres', which cannot enter {above}: "
                "pass a folder it can reach (e.g. `fsm-celery dev /srv/fsm-dev`)",
            )


def find_postgres_bin(name: str) -> str | None:
    """A PostgreSQL server binary, newest version first: Debian keeps them out of PATH, in
    /usr/lib/postgresql/N/bin; None when there is none."""
    versions = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
    )
    return str(versions[-1]) if versions else shutil.which(name)


def _postgres_bin(name: str) -> str:
    found = find_postgres_bin(name)
    if found is None:
        raise DevStackError(name, "not found: install PostgreSQL's server (Debian: postgresql)")
    return found


def _free(port: int, what: str) -> None:
    with socket.socket() as probe:
        if probe.connect_ex((HOST, port)) == 0:
            raise DevStackError(
                what, f"port {port} on {HOST} is taken (another `fsm-celery dev`?): pass another"
            )


def _wait(
    process: subprocess.Popen[bytes],
    log: Path,
    what: str,
    ready: Callable[[], bool],
    stopping: Callable[[], bool],
) -> None:
    """Until the server is ready, or asked to stop (then it is stopped with the others)."""
    deadline = time.monotonic() + START_SECONDS
    while not stopping() and not ready():
        if process.poll() is not None or time.monotonic() > deadline:
            tail = log.read_text(errors="replace")[-1500:] if log.exists() else ""
            process.kill()
            raise DevStackError(what, f"did not start (see {log}):\n{tail}")
        time.sleep(0.2)


def _pg_ready(stack: Stack) -> bool:
    """Whether PostgreSQL accepts connections, its fsm_celery database created the first time."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.exc import OperationalError

    server = create_engine(
        f"postgresql+psycopg2://postgres@{HOST}:{stack.pg_port}/postgres",
        isolation_level="AUTOCOMMIT",
    )
    try:
        with server.connect() as conn:
            found = conn.execute(
                text("SELECT 1 FROM pg_database WHERE datname = :d"), {"d": DATABASE}
            ).first()
            if found is None:
                conn.execute(text(f'CREATE DATABASE "{DATABASE}"'))
        return True
    except OperationalError:
        return False
    finally:
        server.dispose()


def _answers(port: int, ask: bytes, expected: bytes) -> bool:
    try:
        with socket.create_connection((HOST, port), timeout=1) as conn:
            conn.sendall(ask)
            return conn.recv(64).startswith(expected)
    except OSError:
        return False


def _read_env(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    pairs = (line.removeprefix("export ").partition("=") for line in path.read_text().split("\n"))
    return {name: value for name, _, value in pairs if name}
