"""A PgBouncer of a test's own (Debian's pgbouncer), in transaction pooling mode, in front of
the suite's PostgreSQL: each transaction may run on another server session, so a statement
prepared in one is not there in the next (FSM_DATABASE_PREPARE=false is what works here)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy.engine import make_url

from tests.support.services import HOST, free_port, wait_for_sql

BINARIES = ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer")


@dataclass
class PgBouncer:
    directory: Path
    port: int
    process: subprocess.Popen[bytes]
    server_url: str  # the PostgreSQL server's, without a database

    @classmethod
    def start(cls, directory: Path, server_url: str, pool_size: int = 10) -> PgBouncer:
        binary = next((b for b in BINARIES if Path(b).exists()), shutil.which("pgbouncer"))
        if binary is None:
            raise RuntimeError(
                "the PgBouncer tests start a pgbouncer of their own and it is not installed "
                "(Debian: pgbouncer)"
            )
        directory.mkdir(parents=True, exist_ok=True)
        server = make_url(server_url)
        port = free_port()
        config = directory / "pgbouncer.ini"
        config.write_text(
            "[databases]\n"
            f"* = host={server.host} port={server.port} user={server.username}\n"
            "[pgbouncer]\n"
            f"listen_addr = {HOST}\nlisten_port = {port}\nunix_socket_dir =\n"
            "auth_type = any\npool_mode = transaction\n"
            f"default_pool_size = {pool_size}\nmax_client_conn = 500\n"
            "ignore_startup_parameters = extra_float_digits,options\n"
            f"logfile = {directory / 'pgbouncer.log'}\npidfile = {directory / 'pgbouncer.pid'}\n"
        )
        argv = [binary, str(config)]
        if os.geteuid() == 0:  # pgbouncer refuses to run as root
            shutil.chown(directory, "postgres", "postgres")
            directory.parent.chmod(0o755)
            argv[1:1] = ["-u", "postgres"]
        process = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        found = cls(directory, port, process, server_url)
        try:
            found._wait()
        except BaseException:
            found.stop()
            raise
        return found

    @property
    def url(self) -> str:
        """The server URL through PgBouncer (append /DATABASE)."""
        server = make_url(self.server_url)
        return f"postgresql+psycopg2://{server.username}@{HOST}:{self.port}"

    def _wait(self) -> None:
        log = self.directory / "pgbouncer.log"
        wait_for_sql(f"{self.url}/postgres", self.process, "pgbouncer", log, 20)

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
