"""The PostgreSQL and Redis servers the suite talks to.

By default each test process (the one of a plain run, or each xdist worker of `pytest -n N`)
starts throwaway servers of its own, on free ports, in a temporary directory removed at the
end: it needs the server binaries installed, not running, and never touches a server (or a
Redis database) of the user's, nor another worker's. FSM_TEST_DATABASE_URL (a server URL
without a database name; the suite creates and drops databases there) and FSM_TEST_REDIS_URL
point it at existing ones instead, for a run in one process: some tests change a server as a
whole (roles, ACL users, FLUSHALL), which workers sharing it would do under each other.

pytest-postgresql would do the PostgreSQL half, but it cannot run as root (initdb refuses, and
CI runs as root) and it brings psycopg 3 in beside psycopg2; starting `postgres` as its own user
takes a few lines.
"""

from __future__ import annotations

import ctypes
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from contextlib import suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from sqlalchemy import create_engine, text

from fsm_celery.devstack import find_postgres_bin

HOST = "127.0.0.1"
_PR_SET_PDEATHSIG = 1


def worker_name() -> str:
    """This test process's name: its xdist worker's (gw0, gw1, ...), else `main`."""
    return os.environ.get("PYTEST_XDIST_WORKER", "main")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port: int = probe.getsockname()[1]
        return port


def require_services(pg_url: str, redis_url: str) -> None:
    """Fail loudly, naming the service, when PostgreSQL or Redis is not reachable."""
    try:
        redis.Redis.from_url(redis_url, socket_connect_timeout=3).ping()
    except redis.RedisError as exc:
        raise RuntimeError(f"Redis is required at {redis_url} and is not reachable: {exc}") from exc
    engine = create_engine(f"{pg_url}/postgres")
    try:
        with engine.connect() as conn:
            conn.execute(text("select 1"))
    except Exception as exc:
        raise RuntimeError(
            f"PostgreSQL is required at {pg_url} and is not reachable: {exc}"
        ) from exc
    finally:
        engine.dispose()


def _die_with_parent(sig: int) -> Any:
    """A preexec_fn: the server gets sig when the test process dies, even by SIGKILL."""

    def preexec() -> None:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, sig)

    return preexec


def _postgres_bin(name: str) -> str:
    """A PostgreSQL server binary (fsm-celery dev finds them the same way)."""
    found = find_postgres_bin(name)
    if found is None:
        raise RuntimeError(
            f"the tests start a PostgreSQL server of their own and cannot find {name!r}: install "
            "PostgreSQL's server package (Debian: postgresql), or set FSM_TEST_DATABASE_URL to "
            "an existing server (postgresql+psycopg2://user@host:port)"
        )
    return found


@dataclass
class Postgres:
    """A throwaway PostgreSQL server: trust auth for `postgres` on 127.0.0.1, no fsync."""

    directory: Path
    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://postgres@{HOST}:{self.port}"

    def _as_owner(self) -> dict[str, Any]:
        """initdb and postgres refuse to run as root: as root, run them as `postgres`."""
        if os.geteuid() != 0:
            return {}
        try:
            owner = pwd.getpwnam("postgres")
        except KeyError as exc:
            raise RuntimeError(
                "running as root, the tests start PostgreSQL as the user 'postgres', which does "
                "not exist: install Debian's postgresql package or run the tests as another user"
            ) from exc
        return {"user": owner.pw_uid, "group": owner.pw_gid, "extra_groups": []}

    def init(self) -> Postgres:
        self.directory.mkdir(parents=True, exist_ok=True)
        if os.geteuid() == 0:
            self.directory.parent.chmod(0o755)  # mkdtemp's 0700 would shut `postgres` out
            shutil.chown(self.directory, "postgres", "postgres")
        done = subprocess.run(
            [
                _postgres_bin("initdb"),
                *("-D", str(self.directory / "data"), "-U", "postgres", "-A", "trust"),
                *("-E", "UTF8", "--locale=C", "--no-sync"),
            ],
            capture_output=True,
            check=False,
            **self._as_owner(),
        )
        if done.returncode != 0:
            raise RuntimeError(f"initdb failed:\n{done.stdout.decode()}{done.stderr.decode()}")
        return self

    def start(self) -> Postgres:
        log = self.directory / "postgres.log"
        options = {
            "listen_addresses": HOST,
            "unix_socket_directories": str(self.directory),
            "max_connections": "300",
            "fsync": "off",
            "full_page_writes": "off",
            "synchronous_commit": "off",
        }
        owner = self._as_owner()
        with log.open("ab") as out:
            self.process = subprocess.Popen(
                [
                    _postgres_bin("postgres"),
                    *("-D", str(self.directory / "data"), "-p", str(self.port)),
                    *(arg for name, value in options.items() for arg in ("-c", f"{name}={value}")),
                ],
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=subprocess.STDOUT,
                preexec_fn=_die_with_parent(signal.SIGQUIT),
                **owner,
            )
        self._wait(log)
        return self

    def _wait(self, log: Path) -> None:
        assert self.process is not None
        wait_for_sql(f"{self.url}/postgres", self.process, "postgres", log, 30)

    def stop(self) -> None:
        """A fast shutdown (SIGINT): clients are disconnected, the data is kept."""
        if self.process is None:
            return
        self.process.send_signal(signal.SIGINT)
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self.process = None

    def restart(self) -> None:
        self.stop()
        self.start()


def wait_for_sql(
    url: str, process: subprocess.Popen[bytes], name: str, log: Path, timeout: float
) -> None:
    """Until the server the process runs answers `select 1` at the URL; RuntimeError with its
    log's tail if it exits first."""
    db = create_engine(url)
    deadline = time.monotonic() + timeout
    try:
        while True:
            if process.poll() is not None:
                tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail}")
            try:
                with db.connect() as conn:
                    conn.execute(text("select 1"))
                return
            except Exception:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
    finally:
        db.dispose()


def start_redis(
    directory: Path, *extra: str, port: int | None = None, tls_ca: Path | None = None
) -> tuple[subprocess.Popen[bytes], int]:
    """A redis-server on a free port, persisting nothing, logging into directory."""
    binary = shutil.which("redis-server")
    if binary is None:
        raise RuntimeError(
            "the tests start Redis servers of their own and redis-server is not on PATH: "
            "install it (Debian: redis-server)"
        )
    port = port or free_port()
    process = subprocess.Popen(
        [
            binary,
            *("--port", str(port), "--bind", HOST, "--save", "", "--appendonly", "no"),
            *("--dir", str(directory), "--logfile", str(directory / "redis.log")),
            *extra,
        ],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        preexec_fn=_die_with_parent(signal.SIGTERM),
    )
    wait_for_redis(process, port, directory, tls_ca)
    return process, port


def wait_for_redis(
    process: subprocess.Popen[bytes], port: int, directory: Path, tls_ca: Path | None = None
) -> None:
    tls: dict[str, Any] = {} if tls_ca is None else {"ssl": True, "ssl_ca_certs": str(tls_ca)}
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        if process.poll() is not None:
            log = (directory / "redis.log").read_text(errors="replace")
            raise RuntimeError(f"redis-server exited with {process.returncode}:\n{log}")
        try:
            with redis.Redis(host=HOST, port=port, socket_timeout=1, **tls) as client:
                client.ping()
            return
        except redis.ConnectionError:
            time.sleep(0.05)
    stop_redis(process)
    raise RuntimeError(f"redis-server did not answer on port {port} within 10 s")


def stop_redis(process: subprocess.Popen[bytes]) -> None:
    process.terminate()
    try:
        process.wait(10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class RedisServer:
    """A redis-server of a test's own, which it can stop and start again on the same port."""

    def __init__(self, directory: Path, *extra: str) -> None:
        self.directory, self.extra = directory, extra
        self.process, self.port = start_redis(directory, *extra)

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"

    def restart(self, down: float = 0.0) -> None:
        """SHUTDOWN NOSAVE (what it had in memory is lost), down seconds, start again."""
        # the closed connection is SHUTDOWN's answer, not a reason to retry
        with (
            redis.Redis(host=HOST, port=self.port, retry=None) as client,
            suppress(redis.ConnectionError),
        ):
            client.shutdown(nosave=True)
        self.process.wait(10)
        time.sleep(down)
        self.process, _ = start_redis(self.directory, *self.extra, port=self.port)

    def stop(self) -> None:
        stop_redis(self.process)


@dataclass
class Services:
    """The suite's PostgreSQL and Redis: given by the environment, or throwaway ones."""

    pg_url: str
    redis_url: str
    directory: Path | None = None
    postgres: Postgres | None = None
    redis_process: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(cls) -> Services:
        pg_url = os.environ.get("FSM_TEST_DATABASE_URL")
        redis_url = os.environ.get("FSM_TEST_REDIS_URL")
        if pg_url and redis_url:
            return cls(pg_url.rstrip("/"), redis_url)
        directory = Path(tempfile.mkdtemp(prefix=f"fsm-celery-tests-{worker_name()}-"))
        services = cls(pg_url or "", redis_url or "", directory)
        try:
            if not pg_url:
                services.postgres = Postgres(directory / "postgres").init().start()
                services.pg_url = services.postgres.url
            if not redis_url:
                (directory / "redis").mkdir()
                services.redis_process, port = start_redis(directory / "redis")
                services.redis_url = f"redis://{HOST}:{port}/0"
        except BaseException:
            services.stop()
            raise
        return services

    def stop(self) -> None:
        if self.redis_process is not None:
            stop_redis(self.redis_process)
        if self.postgres is not None:
            self.postgres.stop()
        if self.directory is not None:
            shutil.rmtree(self.directory, ignore_errors=True)
