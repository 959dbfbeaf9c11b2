"""The chaos soak (issue 41 §4): machines of every kind at once, under a fault every few seconds,
then checked from PostgreSQL: every machine where its definition says it must be, every join,
gate decision and event counted once, nothing lost, nothing doubled, every process's memory
flat.

    .venv/bin/python -m bench.soak --minutes 30 --mode celery [--broker redis] [--seed S]

It starts servers of its own (PostgreSQL; Redis behind Sentinel: a primary, a replica, three
sentinels), a deployment on them (tests/support/), and every long-lived process twice, a
steady copy and one the faults kill (bench/soak_stack.py). Threads of this process start
plain loops, map fan-outs over child machines, parallel fan-outs, approval gates and waits for
events; a scripted approver decides the gates, a sender sends the events (and resends them), an
operator rewinds and forks loops, a viewer reads the dashboards (bench/soak_actors.py). Faults,
drawn from the seed (bench/soak_faults.py), come until the minutes are up; then the load stops,
the machines in flight are given the drain's minutes to end, and the checks run
(bench/soak_checks.py). The report is a table and the same as JSON (--output writes it to a
file); the exit status is 0 when every check passed, 1 when one failed, 2 when the run could
not start. The processes' logs stay in the folder the report names.

Not a test: too long for CI. docs/reliability.md says what it does and records its runs.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import sys
import time
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from sqlalchemy import text

from bench.soak_actors import Actor, Approver, Journal, Load, Operator, Sender, Viewer
from bench.soak_checks import Check, Records, fetch, run_checks, where_ended
from bench.soak_faults import EVERY, kinds_for, schedule
from bench.soak_memory import Sampler
from bench.soak_report import table
from bench.soak_stack import BrokerUnavailable, Stack
from tests.support.credentials import TEST_SECRET
from tests.support.processes import LOGS

DEFAULT_SOAK_LOGS = "/tmp/fsm-celery-soak-logs"
SOAK_LOGS = Path(os.environ.get("FSM_SOAK_LOGS", DEFAULT_SOAK_LOGS))
EXITS_CHECK, MEMORY_CHECK = "no process exited by itself", "memory flat"
IN_FLIGHT = text("SELECT count(*) FROM state_machines WHERE status IN ('running', 'paused')")


def parse(argv: list[str] | None) -> argparse.Namespace:
    summary = (__doc__ or "").split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m bench.soak", description=summary)
    parser.add_argument("--minutes", type=float, default=30.0, help="of load and faults (30)")
    parser.add_argument("--mode", choices=["celery", "inline"], default="celery")
    parser.add_argument("--broker", choices=["redis", "amqp"], default="redis")
    parser.add_argument("--seed", type=int, default=None, help="of the faults and the load")
    parser.add_argument(
        "--drain-minutes", type=float, default=5.0, help="for the machines in flight to end (5)"
    )
    parser.add_argument(
        "--every",
        type=float,
        nargs=2,
        default=EVERY,
        metavar=("LOW", "HIGH"),
        help=f"seconds between two faults, drawn uniformly ({EVERY[0]:g} {EVERY[1]:g})",
    )
    parser.add_argument("--output", type=Path, help="write the JSON report there too")
    args = parser.parse_args(argv)
    if args.minutes <= 0 or args.drain_minutes < 0:
        parser.error("--minutes must be positive and --drain-minutes not negative")
    if args.seed is None:
        args.seed = random.SystemRandom().randrange(1_000_000)
    return args


class Soak:
    """One run: the load, the faults, the drain, the checks."""

    def __init__(self, stack: Stack, args: argparse.Namespace) -> None:
        self.stack, self.args = stack, args
        self.seconds = args.minutes * 60
        self.journal = Journal()
        self.revive_failures: Counter[str] = Counter()
        self.timeline: list[dict[str, Any]] = []

    def run(self) -> dict[str, Any]:
        began = datetime.now(UTC)
        self.stack.start_processes()
        settings, seed = self.stack.env.settings, self.args.seed
        load, operator = Load(settings, self.journal, seed), Operator(settings, self.journal, seed)
        others: list[Actor] = [
            Approver(settings, self.journal, seed),
            Sender(settings, self.journal, seed),
            Viewer(settings, self.journal, seed, self._dashboards),
        ]
        sampler = Sampler(self._processes, max(1.0, min(5.0, self.seconds / 90)))
        sampler.start()
        for actor in (load, operator, *others):
            actor.start()
        t0 = time.monotonic()
        self._faults(t0)
        load.stop()
        operator.stop()
        drained = self._drain()
        for actor in others:
            actor.stop()
        sampler.stop()
        records = fetch(self.stack.env.client.engine.db)
        checks = run_checks(records, self.journal)
        memory = sampler.report()
        checks.append(exits_check(self.stack))
        checks.append(memory_check(memory))
        return self._report(began, time.monotonic() - t0, drained, records, checks, memory)

    def _dashboards(self) -> list[str]:
        return [r.url for r in self.stack.roles if r.kind == "dashboard" and r.proc is not None]

    def _processes(self) -> list[tuple[str, int]]:
        found = [
            (role.name, role.proc.popen.pid)
            for role in self.stack.roles
            if role.proc is not None and role.proc.popen.poll() is None
        ]
        if self.stack.postgres.process is not None:
            found.append(("postgres", self.stack.postgres.process.pid))
        for node in self.stack.cluster.nodes:
            if node.process.poll() is None:
                found.append((f"redis:{node.port}", node.process.pid))
        return found

    def _faults(self, t0: float) -> None:
        """The schedule's faults, one at a time; one that comes due while the one before is
        still being carried out (a failover takes seconds) waits the shortest gap after it,
        so the deployment moves between faults; those pushed past the end are not made."""
        kinds, gap = kinds_for(self.args.broker), self.args.every[0]
        done = t0
        for fault in schedule(self.args.seed, self.seconds, kinds, tuple(self.args.every)):
            due = max(t0 + fault.at, done + gap)
            if due >= t0 + self.seconds:
                break
            self._idle_until(due)
            at = time.monotonic()
            error = None
            try:
                self.stack.carry_out(fault.kind)
            except Exception as exc:
                error = f"{type(exc).__name__}: {exc}"[:300]
            self.timeline.append(
                {
                    "at_s": round(at - t0, 1),
                    "kind": fault.kind,
                    "took_s": round(time.monotonic() - at, 1),
                    "error": error,
                }
            )
            done = time.monotonic()
        self._idle_until(t0 + self.seconds)

    def _idle_until(self, deadline: float) -> None:
        """Until the deadline, start again every process that is down, once a second."""
        while (left := deadline - time.monotonic()) > 0:
            for failure in self.stack.revive():
                self.revive_failures[failure.partition(":")[0]] += 1
            time.sleep(min(1.0, max(left, 0.0)))

    def _drain(self) -> float:
        """Seconds until no machine runs (the processes kept up meanwhile), at most the
        drain's minutes."""
        began = time.monotonic()
        deadline = began + self.args.drain_minutes * 60
        while time.monotonic() < deadline:
            try:
                with self.stack.env.client.engine.db.connect() as conn:
                    if int(conn.execute(IN_FLIGHT).scalar_one()) == 0:
                        break
            except Exception:  # a server coming back from the last fault
                pass
            self._idle_until(time.monotonic() + 1)
        return round(time.monotonic() - began, 1)

    def _report(
        self,
        began: datetime,
        elapsed: float,
        drained: float,
        records: Records,
        checks: list[Check],
        memory: dict[str, dict[str, object]],
    ) -> dict[str, Any]:
        journal = self.journal
        carried = Counter(f["kind"] for f in self.timeline if f["error"] is None)
        failed = Counter(f["kind"] for f in self.timeline if f["error"] is not None)
        return {
            "soak": {
                "mode": self.args.mode,
                "broker": self.args.broker,
                "seed": self.args.seed,
                "minutes": self.args.minutes,
                "began": began.isoformat(timespec="seconds"),
                "load_and_faults_s": round(elapsed - drained, 1),
                "drain_s": drained,
                "logs": str(LOGS),  # until main copies them
            },
            "machines": {
                "started": dict(sorted(Counter(journal.started.values()).items())),
                "children": sum(1 for m in records.machines if m["parent_id"] is not None),
                "ended": where_ended(records),
            },
            "faults": {
                "carried_out": dict(sorted(carried.items())),
                "failed": dict(sorted(failed.items())),
                "timeline": self.timeline,
            },
            "processes": {
                role.name: {"killed": role.kills, "exited_by_itself": role.exits}
                for role in self.stack.roles
            },
            "restarts_refused": dict(self.revive_failures),
            "actors": {
                "gates_decided": len(journal.decisions),
                "events_sent": sum(len(v) for v in journal.events.values()),
                "rewinds": sum(len(v) for v in journal.rewinds.values()),
                "forks": len(journal.forks),
                "refused": dict(journal.refused),
                "errors": dict(journal.errors),
                "dashboard_reads": dict(journal.reads),
            },
            "rejected_messages": {r["reason"]: r["n"] for r in records.rejected},
            "checks": {check.name: check.summary() for check in checks},
            "memory": memory,
            "passed": all(check.passed for check in checks),
        }


def exits_check(stack: Stack) -> Check:
    """No process of the product exited by itself (the soak started each again)."""
    check = Check(EXITS_CHECK)
    for role in stack.roles:
        check.checked += 1 + role.kills + len(role.exits)  # each copy of the role that ran
        check.failures.extend(f"{role.name}: {gone}" for gone in role.exits)
    return check


def memory_check(memory: dict[str, dict[str, object]]) -> Check:
    """Every series long enough to judge stayed flat (bench/soak_memory.py)."""
    check = Check(MEMORY_CHECK)
    for name, figures in sorted(memory.items()):
        if figures["flat"] is None:
            continue
        check.checked += 1
        if figures["flat"] is False:
            check.fail(
                f"{name}: {figures['first_third_median_mb']} -> "
                f"{figures['last_third_median_mb']} MiB (bound {figures['bound_mb']})"
            )
    return check


def keep_logs(args: argparse.Namespace) -> Path:
    """The processes' logs, copied where the next run of the suite or the soak (which remove
    the log folders of processes that have ended) leaves them."""
    stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
    kept = SOAK_LOGS / f"{args.mode}-{args.broker}-seed{args.seed}-{stamp}"
    if LOGS.is_dir():
        shutil.copytree(LOGS, kept, dirs_exist_ok=True)
    return kept


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    os.environ.pop("FSM_BROKER_URL", None)  # the deployment's own, never the caller's
    os.environ.setdefault("FSM_TASK_TOKEN_SECRET", TEST_SECRET)
    try:
        stack = Stack.start(args.mode, args.broker)
    except BrokerUnavailable as exc:
        print(f"bench.soak: {exc}", file=sys.stderr)
        return 2
    try:
        report = Soak(stack, args).run()
    finally:
        stack.stop()
        kept = keep_logs(args)
    report["soak"]["logs"] = str(kept)
    print(table(report))
    print(json.dumps(report, indent=2, default=str))
    if args.output is not None:
        args.output.write_text(json.dumps(report, indent=2, default=str) + "\n")
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
