"""`fsm-celery doctor`: is this deployment able to run machines? One line per check, with the fix.

Each check is independent: one that cannot run (a service down) fails alone and the others
still report.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Engine

from fsm_celery.config import Settings
from fsm_celery.core.loader import definition_files, load_all
from fsm_celery.exceptions import FsmError

BEAT_STALE_SECONDS = 10.0  # a scan runs every second: ten seconds without one is beat gone


@dataclass(frozen=True)
class Finding:
    """What one check found; the table of checks (Doctor.checks) names it."""

    ok: bool
    detail: str
    fix: str = ""


def good(detail: str) -> Finding:
    return Finding(True, detail)


def bad(detail: str, fix: str) -> Finding:
    return Finding(False, detail, fix)


@dataclass(frozen=True)
class Result:
    name: str
    ok: bool
    detail: str
    fix: str = ""

    def line(self) -> str:
        mark = "✔" if self.ok else "✘"
        fix = f" — {self.fix}" if not self.ok and self.fix else ""
        return f"{mark} {self.name}: {self.detail}{fix}"


class Doctor:
    def __init__(self, settings: Settings, ping_timeout: float = 1.0) -> None:
        self.settings = settings
        self.ping_timeout = ping_timeout
        self._db: Engine | None = None
        self._redis: Any = None

    def checks(self) -> Iterator[Result]:
        """Run every check, each contained: one that raises is reported as failed."""
        checks: list[tuple[str, Callable[[], Finding], str]] = [
            ("database", self.database, "check FSM_DATABASE_URL and that PostgreSQL runs"),
            ("redis", self.redis, "check FSM_REDIS_URL and that Redis runs"),
            ("broker", self.broker, "check FSM_BROKER_URL (else FSM_REDIS_URL) and its server"),
            ("definitions", self.definitions, "run: fsm-celery definitions load"),
            ("workers", self.workers, "start one: celery -A fsm_celery worker"),
            ("queues", self.queues, "start a worker on each: celery -A fsm_celery worker -Q Q"),
            ("beat", self.beat, "start it: celery -A fsm_celery beat"),
            ("bridges", self.bridges, "start one: fsm-celery ack-bridge"),
            ("agents", self.agents, "start one: fsm-celery agent --mock, or your agent"),
            (
                "history",
                self.history,
                "start beat (its hourly job makes them), or run: fsm-celery history months --make",
            ),
            ("token secret", self.secret, "set FSM_TASK_TOKEN_SECRET (see docs/protocol.md)"),
            ("channel prefix", self.prefix, "set FSM_CHANNEL_PREFIX (see docs/protocol.md)"),
        ]
        try:
            for name, check, fix in checks:
                try:
                    found = check()
                except Exception as exc:
                    found = self._failed(exc, fix)
                yield Result(name, found.ok, found.detail, found.fix)
        finally:
            if self._db is not None:
                self._db.dispose()
            if self._redis is not None:
                self._redis.close()

    def _failed(self, exc: Exception, fix: str) -> Finding:
        """The line of a check that raised: what is missing and how to get it, when known."""
        from fsm_celery.store.db import createdb_command, missing_database

        if _missing_table(exc):
            detail = f"the schema is missing ({_driver_message(exc)})"
            return bad(detail, "run: fsm-celery db upgrade")
        database = missing_database(exc)
        if database is not None:
            return bad(
                f"database {database} does not exist (PostgreSQL answered)",
                f"create it ({createdb_command(self.settings.database_url)}) "
                "or run: fsm-celery db upgrade --create",
            )
        return bad(_one_line(exc), _fix_for(exc, fix))

    def _database(self) -> Engine:
        if self._db is None:
            from fsm_celery.store.db import connect

            self._db = connect(self.settings.database_url)
        return self._db

    def _client(self) -> Any:
        if self._redis is None:
            from fsm_celery.channel.redis import connect

            self._redis = connect(self.settings.redis_url)
        return self._redis

    def database(self) -> Finding:
        from alembic.script import ScriptDirectory

        from fsm_celery.store.db import alembic_config, current_revision

        db = self._database()
        at = current_revision(db)
        head = ScriptDirectory.from_config(alembic_config(str(db.url))).get_current_head()
        where = db.url.render_as_string(hide_password=True)
        if at != head:
            return bad(
                f"{where} is at migration {at or 'none'}, the code needs {head}",
                "run: fsm-celery db upgrade",
            )
        return good(f"{where}, migrations at head ({head})")

    def redis(self) -> Finding:
        client = self._client()
        client.ping()
        policy = client.config_get("maxmemory-policy").get("maxmemory-policy")
        if policy != "noeviction":
            return bad(
                f"maxmemory-policy is {policy}: an evicting Redis drops broker messages",
                "set maxmemory-policy noeviction (redis.conf or CONFIG SET)",
            )
        return good("reachable, maxmemory-policy noeviction")

    def broker(self) -> Finding:
        """Celery's broker, whichever it is (Redis or RabbitMQ): named, reached, the tasks
        waiting in the deployment's queues counted."""
        from fsm_celery.channel.redis import connect
        from fsm_celery.urls import mask
        from fsm_celery.worker.broker import all_queues, broker_name, queue_lengths

        name = broker_name(self.settings)
        if name == "memory":
            return good("memory (in one process only: the embedded mode)")
        lengths = queue_lengths(self.settings, connect)(all_queues(self.settings))
        waiting = ", ".join(f"{queue} {count}" for queue, count in lengths.items())
        where = mask(self.settings.celery_broker_url)
        return good(f"{name} at {where}, reachable; tasks waiting: {waiting}")

    def definitions(self) -> Finding:
        from fsm_celery.store import queries as q

        folder = self.settings.definitions
        files = load_all(definition_files(folder))
        stale: list[str] = []
        with self._database().connect() as conn:
            for definition in files:
                latest = q.latest_definition_txn(conn, definition.type)
                if latest is None or latest[1].digest() != definition.digest():
                    stale.append(definition.type)
        if stale:
            return bad(
                f"{', '.join(stale)} in {folder} not loaded as they are",
                "run: fsm-celery definitions load",
            )
        return good(f"{len(files)} loaded, in sync with {folder}")

    def _celery(self) -> Any:
        from fsm_celery.worker.app import app

        app.conf.broker_url = self.settings.celery_broker_url
        app.conf.broker_transport_options = self.settings.celery_transport_options
        return app

    def workers(self) -> Finding:
        """The workers that answer, and those whose pool cannot combine tasks' transactions
        (worker/shape.py: said, not failed, since it works), from one remote-control request."""
        from fsm_celery.worker.shape import slow_shape

        replies = self._celery().control.inspect(timeout=self.ping_timeout).stats() or {}
        names = sorted(replies)
        if not names:
            return bad(
                f"none answered a ping within {self.ping_timeout:g} s",
                "start one: celery -A fsm_celery worker",
            )
        slow = []
        for name in names:
            pool = replies[name].get("pool") or {}
            implementation = str(pool.get("implementation", ""))
            said = slow_shape(implementation, int(pool.get("max-concurrency") or 1))
            if said is not None:
                slow.append(f"; {name}: {said}")
        return good(f"{len(names)} answering ({', '.join(names[:3])}…)" + "".join(slow))

    def queues(self) -> Finding:
        """Whether a worker consumes each queue the machines' tasks go to (FSM_QUEUE, and
        FSM_QUEUES's): a queue nobody consumes holds its machines' work forever."""
        app = self._celery()
        wanted = [*self.settings.work_queues, self.settings.housekeeping_queue]
        replies = app.control.inspect(timeout=self.ping_timeout).active_queues() or {}
        consumed = {q["name"] for queues in replies.values() for q in queues}
        missing = [q for q in wanted if q not in consumed]
        if not replies:
            return bad("no worker answered", "start one: celery -A fsm_celery worker")
        if missing:
            return bad(
                f"no worker consumes {', '.join(missing)}",
                f"start one: celery -A fsm_celery worker -Q {','.join(missing)}",
            )
        return good(f"each consumed: {', '.join(wanted)}")

    def beat(self) -> Finding:
        from fsm_celery.store import schedules as schedule_store

        with self._database().connect() as conn:
            last = schedule_store.last_run_txn(conn, "scan")
        if last is None:
            return bad("no scan ever ran", "start it: celery -A fsm_celery beat")
        if last.tzinfo is None:
            last = last.replace(tzinfo=UTC)
        age = (datetime.now(UTC) - last).total_seconds()
        if age > max(BEAT_STALE_SECONDS, 5 * self.settings.scan_interval_seconds):
            return bad(
                f"the last scan ran {age:.0f} s ago (timeouts are not being applied)",
                "start it: celery -A fsm_celery beat (and a worker to run its scan)",
            )
        return good(f"the last scan ran {age:.1f} s ago")

    def history(self) -> Finding:
        """The history's months (PostgreSQL): the next one made ahead, so that machines started
        then can be written; and what the retention keeps."""
        from fsm_celery.store import partitions

        db = self._database()
        if db.dialect.name != "postgresql":
            return good("one table (SQLite: not partitioned)")
        with db.connect() as conn:
            months = {t: partitions.listed(conn, t) for t in partitions.KEYS}
        coming = partitions.next_month(partitions.month(datetime.now(UTC)))
        for table, listed in months.items():
            if not any(p.start == coming for p in listed):
                return bad(
                    f"{table} has no partition for {coming:%Y-%m}: what is written then fails",
                    "start beat (its hourly job makes them), or run: fsm-celery history months "
                    "--make",
                )
        listed = months[partitions.HISTORY]
        days = self.settings.history_retention_days
        kept = f"kept {days:g} days past their month" if days else "kept forever"
        span = f"{listed[0].start:%Y-%m} to {listed[-1].start:%Y-%m}"
        return good(f"{len(listed)} months ({span}), {kept}")

    def bridges(self) -> Finding:
        from fsm_celery.acks.streams import ALIVE_KEY, GROUP
        from fsm_celery.core.messages import ack_stream

        client = self._client()
        prefix = self.settings.channel_prefix
        pattern = prefix + ALIVE_KEY.format(consumer="*")
        alive = list(client.scan_iter(match=pattern, count=1000))
        stream = ack_stream(prefix)
        lag, pending, oldest = _group_backlog(client, stream, GROUP)
        backlog = f"ack stream lag {lag}, pending {pending}"
        if oldest is not None:
            backlog += f", oldest pending {oldest:.0f} s"
        if not alive:
            return bad(f"none alive; {backlog}", "start one: fsm-celery ack-bridge")
        if oldest is not None and oldest > 2 * self.settings.stream_claim_idle_seconds:
            return bad(
                f"{len(alive)} alive, but {backlog}: acks are not being applied",
                "check the bridges' logs and the workers that run fsm.apply_acks",
            )
        return good(f"{len(alive)} alive; {backlog}")

    def agents(self) -> Finding:
        """An agent alive for every agent type the definitions name (their states' and their
        children's too), those of the definitions folder and every type loaded in the database
        (its newest version): without one, machines wait in a state of that type until it
        times out."""
        from fsm_celery.store import agents as agent_store
        from fsm_celery.store import queries as q
        from fsm_celery.store import reads

        found = {d.type: d for d in load_all(definition_files(self.settings.definitions))}
        since = datetime.now(UTC) - timedelta(seconds=self.settings.agent_liveness_seconds)
        with self._database().connect() as conn:
            for machine_type in reads.machine_types_txn(conn):
                latest = q.latest_definition_txn(conn, machine_type)
                if latest is not None:
                    found[machine_type] = latest[1]  # what machines of the type start on
            alive = agent_store.alive_agents_by_type_txn(conn, since)
        needed: dict[str, list[str]] = {}
        for definition in found.values():
            for agent_type in definition.agent_types_named():
                needed.setdefault(agent_type, []).append(definition.type)
        missing = sorted(t for t in needed if not alive.get(t))
        if missing:
            serves = "; ".join(f"{t} ({', '.join(sorted(needed[t]))})" for t in missing)
            flags = " ".join(f"--agent-type {t}" for t in missing)
            return bad(
                f"none alive for agent type {serves}: their machines would wait and time out",
                f"start one: fsm-celery agent --mock {flags} (scripted outputs, to try it out), "
                "or your agent (fsm-celery agent --app module:attribute)",
            )
        shown = ", ".join(f"{t} {alive[t]}" for t in sorted(needed))
        return good(f"alive for every agent type ({shown})")

    def secret(self) -> Finding:
        problem = self.settings.secret_problem()
        if problem is not None:
            return bad(
                problem,
                f"set {problem.partition(' ')[0]} to 32+ random bytes "
                "(python3 -c 'import secrets; print(secrets.token_hex(32))')",
            )
        return good(f"set ({len(self.settings.token_secrets)} accepted)")

    def prefix(self) -> Finding:
        """Deployments sharing a Redis must not share key names: ACLs cannot split databases."""
        from fsm_celery.channel.acl import database_of

        if self.settings.channel_prefix:
            return good(repr(self.settings.channel_prefix))
        database = database_of(self.settings.redis_url)
        others = sorted(
            int(name[2:]) for name in self._client().info("keyspace") if name != f"db{database}"
        )
        if database == 0 and not others:
            return good("none (the only deployment on this Redis)")
        shared = f"database {database}" + (f"; databases {others} hold keys" if others else "")
        return bad(
            f"none, on a shared Redis ({shared}): an agent user can SELECT another database "
            "and reach its deployment's keys",
            "give each deployment its own FSM_CHANNEL_PREFIX (docs/protocol.md, Identity), "
            "then reissue its agents' credentials",
        )


def _group_backlog(client: Any, stream: str, group: str) -> tuple[int, int, float | None]:
    """The consumer group's lag (entries never read), pending entries, and the oldest pending
    entry's age in seconds; zeros when no bridge made the group yet."""
    import redis

    try:
        groups = client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream yet
        return 0, 0, None
    info = next((g for g in groups if _text(g.get("name")) == group), None)
    if info is None:
        return 0, 0, None
    lag = int(info.get("lag") or 0)
    pending = int(info.get("pending") or 0)
    oldest = None
    if pending:
        summary = client.xpending(stream, group)
        first = _text(summary.get("min") or "")
        if first:
            oldest = time.time() - int(first.split("-")[0]) / 1000
    return lag, pending, oldest


def _fix_for(exc: Exception, fix: str) -> str:
    """The fix of a check that could not run: the service first, when it is unreachable."""
    import kombu.exceptions
    import redis
    import sqlalchemy.exc

    if isinstance(exc, sqlalchemy.exc.OperationalError):
        return "check FSM_DATABASE_URL and that PostgreSQL runs"
    if isinstance(exc, redis.ConnectionError):
        return "check FSM_REDIS_URL and that Redis runs"
    if isinstance(exc, kombu.exceptions.OperationalError):
        return "check FSM_BROKER_URL (else FSM_REDIS_URL) and that the broker runs"
    return fix


def _missing_table(exc: Exception) -> bool:
    """A query met a table that the migrations have not created (yet)."""
    orig = getattr(exc, "orig", None)
    return getattr(orig, "pgcode", None) == "42P01" or "no such table" in str(orig)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _one_line(exc: BaseException) -> str:
    if isinstance(exc, FsmError):
        return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    return f"{type(exc).__name__}: {_driver_message(exc)}".rstrip(": ")


def _driver_message(exc: BaseException) -> str:
    """The first line of what the driver said (SQLAlchemy wraps it), or of the error itself."""
    orig = getattr(exc, "orig", None)
    text = str(orig if orig is not None else exc).strip().splitlines()
    return text[0] if text else ""


WATCHING = (
    "watching it: Prometheus alert rules and a scrape config in deploy/prometheus/, a Grafana "
    "dashboard in deploy/grafana/, what to do when an alert fires in docs/operations.md"
)


def run(settings: Settings, out: Callable[[str], None]) -> bool:
    """Print one line per check, then where the alerts and their runbook are; whether every
    check passed."""
    ok = True
    for result in Doctor(settings).checks():
        out(result.line())
        ok = ok and result.ok
    out(WATCHING)
    return ok
