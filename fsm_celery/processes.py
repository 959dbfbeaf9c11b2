"""This deployment's long-lived processes, each recorded in the deployment's state directory
(FSM_STATE_DIR) while it runs, so that `fsm-celery stop` stops them and nothing else: a
`pkill -f` by name also stops every other deployment's processes on a shared host.

A record is `processes/<kind>-<pid>.json`: the pid, the kernel's start time of that process
(so a pid the system reused for another process is never taken for it) and its command line.
The process removes its record when it exits; one killed outright leaves its record behind,
which the next reading finds dead and removes.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path

RECORDS = "processes"
STOP_POLL = 0.2  # seconds between looks at the processes being stopped


@dataclass(frozen=True)
class Record:
    """A recorded process of this deployment."""

    kind: str  # worker, beat, ack-bridge, agent, dashboard, flower
    pid: int
    started: str  # /proc/<pid>/stat's start time ("" where there is no /proc)
    argv: list[str]
    path: Path

    def alive(self) -> bool:
        """Whether the process is still the one recorded."""
        return _start_time(self.pid) == self.started and _exists(self.pid)

    @property
    def line(self) -> str:
        return f"{self.kind} {self.pid}: {' '.join(self.argv)}"


def record(state_directory: Path, kind: str) -> Path:
    """Record this process as one of the deployment's, until it exits."""
    folder = state_directory / RECORDS
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    pid = os.getpid()
    path = folder / f"{kind}-{pid}.json"
    data = {"kind": kind, "pid": pid, "started": _start_time(pid), "argv": sys.argv}
    path.write_text(json.dumps(data))
    atexit.register(_forget, path, pid)
    return path


def running(state_directory: Path) -> list[Record]:
    """The deployment's recorded processes still running (the records of dead ones removed)."""
    found = []
    for path in sorted((state_directory / RECORDS).glob("*.json")):
        try:
            data = json.loads(path.read_text())
            pid, started = int(data["pid"]), str(data["started"])
            found.append(Record(str(data["kind"]), pid, started, list(data["argv"]), path))
        except (OSError, ValueError, KeyError, TypeError):  # half-written, or not ours
            continue
    alive = [r for r in found if r.alive()]
    for gone in (r for r in found if r not in alive):
        gone.path.unlink(missing_ok=True)
    return alive


def stop(records: list[Record], timeout: float, kill: bool = False) -> list[Record]:
    """SIGTERM each (a worker's warm shutdown: it finishes its tasks), wait up to `timeout`
    seconds for them to exit; with `kill`, SIGKILL those left. The ones still running."""
    for found in records:
        _signal(found, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    left = [r for r in records if r.alive()]
    while left and time.monotonic() < deadline:
        time.sleep(STOP_POLL)
        left = [r for r in left if r.alive()]
    if kill:
        for found in left:
            _signal(found, signal.SIGKILL)
        time.sleep(STOP_POLL)
        left = [r for r in left if r.alive()]
    for gone in (r for r in records if r not in left):
        gone.path.unlink(missing_ok=True)
    return left


def _signal(found: Record, signum: int) -> None:
    if found.alive():  # checked right before: never a pid reused since it was read
        with contextlib.suppress(ProcessLookupError):
            os.kill(found.pid, signum)


def _forget(path: Path, pid: int) -> None:
    if os.getpid() == pid:  # not in a forked child (a prefork pool's), which inherits atexit
        path.unlink(missing_ok=True)


def _exists(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # someone else's: alive, though not ours to signal
        return True
    return not _zombie(pid)


def _zombie(pid: int) -> bool:
    """A child that exited and was not reaped yet (the caller's own) is gone for this purpose."""
    fields = _stat_fields(pid)
    return fields is not None and fields[0] == "Z"


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux), or "" where unknown."""
    fields = _stat_fields(pid)
    return fields[19] if fields is not None and len(fields) > 19 else ""


def _stat_fields(pid: int) -> list[str] | None:
    """/proc/<pid>/stat's fields after the command's name (which may hold spaces)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat[stat.rindex(")") + 2 :].split()
