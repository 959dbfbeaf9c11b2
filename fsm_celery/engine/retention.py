"""The history's months (PostgreSQL; fsm_celery.store.partitions): beat's hourly job makes the
months ahead, and removes those past their retention: the history's past
FSM_HISTORY_RETENTION_DAYS, archived first (FSM_HISTORY_ARCHIVE), the rejected messages' past
FSM_REJECTED_RETENTION_DAYS. `fsm-celery history archive` runs the same now.

A month of history is a month of machines (by their creation): it goes only once every one of
them has ended and none changed within the retention, and once the statistics have folded its
rows. It is detached first (after which nothing can be written to it), checked again (a machine
retried or rewound meanwhile), and put back if one is found; archived, then dropped. Each month
stands alone: one that fails is reported and left for the next run, the others go on. Two runs
at once (two beats, the command beside beat) do not both work: the second finds the first's
lease and does nothing.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import sqlalchemy.exc
from sqlalchemy import Connection, text

from fsm_celery.config import ARCHIVE_TABLE
from fsm_celery.engine.runtime import Runtime
from fsm_celery.store import partitions as parts
from fsm_celery.store import writes
from fsm_celery.store.rollup import HISTORY as FOLD

log = logging.getLogger(__name__)

ENDED = tuple(status.value for status in writes.ENDED)
LEASE = "history-retention"  # its row in liveness, locked while a run works


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a run did to one month: made, archived (to a file), kept (as a table), dropped,
    held (not removable yet: why), failed (the error), or would go (a dry run)."""

    table: str
    month: str  # YYYY-MM
    action: str
    detail: str = ""
    rows: int | None = None

    def line(self) -> str:
        rows = f", {self.rows:,} rows" if self.rows is not None else ""
        detail = f": {self.detail}" if self.detail else ""
        return f"{self.table} {self.month} {self.action}{rows}{detail}"


class Retention:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    @property
    def partitioned(self) -> bool:
        return self._rt.db.dialect.name == "postgresql"

    def months(self) -> dict[str, list[parts.Partition]]:
        """Each partitioned table's months, oldest first (none on SQLite)."""
        if not self.partitioned:
            return {}
        with self._rt.db.connect() as conn:
            return {table: parts.listed(conn, table) for table in parts.KEYS}

    def run(
        self,
        retention_days: float | None = None,
        archive: str | None = None,
        dry_run: bool = False,
    ) -> list[Outcome]:
        """Make the months ahead, then remove the months past their retention (the settings',
        unless given); a dry run says which would go and changes nothing. Nothing on SQLite, or
        while another run holds the lease."""
        if not self.partitioned:
            return []
        settings = self._rt.settings
        days = settings.history_retention_days if retention_days is None else retention_days
        archive = settings.history_archive if archive is None else archive
        lease = self._rt.db.connect()
        try:
            with lease.begin():
                if not self._lease(lease):
                    log.info("another run of the history's retention is under way")
                    return []
                now = self._rt.clock()
                done = [] if dry_run else self.make_ahead(now)
                if days > 0:
                    cutoff = now - timedelta(days=days)
                    done += self._expire(parts.HISTORY, cutoff, archive, dry_run)
                rejected = now - timedelta(days=settings.rejected_retention_days)
                done += self._expire(parts.REJECTED, rejected, "", dry_run)
        finally:
            lease.close()
        for outcome in done:
            log.log(logging.WARNING if outcome.action == "failed" else logging.INFO, outcome.line())
        return done

    def _lease(self, conn: Connection) -> bool:
        """Lock the lease's row for this run (held by its open transaction, which reads
        nothing else: a detach does not wait for it); false when another run holds it."""
        conn.execute(
            text("INSERT INTO liveness (name, at) VALUES (:name, now()) ON CONFLICT DO NOTHING"),
            {"name": LEASE},
        )
        held = conn.execute(
            text("SELECT name FROM liveness WHERE name = :name FOR UPDATE SKIP LOCKED"),
            {"name": LEASE},
        ).first()
        if held is None:
            return False
        conn.execute(text("UPDATE liveness SET at = now() WHERE name = :name"), {"name": LEASE})
        return True

    def make_ahead(self, now: datetime | None = None) -> list[Outcome]:
        """Make the months from now's through AHEAD months past it that are missing."""
        if not self.partitioned:
            return []
        now = now or self._rt.clock()
        done = []
        for table in parts.KEYS:
            try:
                made = parts.ensure(self._rt.db, table, now, parts.ahead(now))
            except sqlalchemy.exc.DBAPIError as error:
                done.append(Outcome(table, f"{now:%Y-%m}", "failed", _short(error)))
                continue
            done += [Outcome(table, _month_of(name), "made") for name in made]
        return done

    def _expire(self, table: str, cutoff: datetime, archive: str, dry_run: bool) -> list[Outcome]:
        """The table's months that ended before the cutoff, and any a run left detached."""
        db = self._rt.db
        with db.connect() as conn:
            due = [p for p in parts.listed(conn, table) if p.end <= cutoff]
            left = parts.detached(conn, table)
        done = []
        for name in left:  # an earlier run stopped between detaching and removing these
            done.append(self._retire(table, name, cutoff, archive, dry_run))
        for month in due:
            done.append(self._remove(month, cutoff, archive, dry_run))
        return done

    def _remove(
        self, month: parts.Partition, cutoff: datetime, archive: str, dry_run: bool
    ) -> Outcome:
        table, name = month.parent, month.name
        try:
            held = self._held(table, name, month.start, month.end, cutoff)
            if held is not None:
                return Outcome(table, _month_of(name), "held", held)
            if dry_run:
                return Outcome(table, _month_of(name), "would go", _where(archive), month.rows)
            parts.detach(self._rt.db, month)
            return self._retire(table, name, cutoff, archive, dry_run)
        except (sqlalchemy.exc.DBAPIError, OSError, RuntimeError) as error:
            return Outcome(table, _month_of(name), "failed", _short(error))

    def _retire(
        self, table: str, name: str, cutoff: datetime, archive: str, dry_run: bool
    ) -> Outcome:
        """A detached month: checked again now that nothing can be written to it (put back
        if a machine of it came back to work meanwhile), then archived and dropped."""
        month = _month_of(name)
        start = parts.start_of(name)
        try:
            held = self._held(table, name, start, parts.next_month(start), cutoff)
            if dry_run:
                return Outcome(table, month, "would go" if held is None else "held", held or "")
            if held is not None:
                parts.attach(self._rt.db, table, name)
                return Outcome(table, month, "held", f"{held} (put back)")
            if table != parts.HISTORY or not archive or parts.empty(self._rt.db, name):
                parts.drop(self._rt.db, name)
                return Outcome(table, month, "dropped")
            if archive == ARCHIVE_TABLE:
                return Outcome(table, month, "kept", parts.keep_as_table(self._rt.db, name))
            path, rows = parts.archive_to_file(self._rt.db, name, Path(archive))
            parts.drop(self._rt.db, name)
            return Outcome(table, month, "archived", str(path), rows)
        except (sqlalchemy.exc.DBAPIError, OSError, RuntimeError) as error:
            return Outcome(table, month, "failed", _short(error))

    def _held(
        self, table: str, name: str, start: datetime, end: datetime, cutoff: datetime
    ) -> str | None:
        """Why the month must stay, or None."""
        if table != parts.HISTORY:
            return None
        with self._rt.db.connect() as conn:
            busy = conn.execute(
                text(
                    "SELECT id, status, updated_at FROM state_machines"
                    " WHERE created_at >= :start AND created_at < :end"
                    " AND (status NOT IN :ended OR updated_at >= :cutoff) LIMIT 1"
                ).bindparams(sqlalchemy.bindparam("ended", expanding=True)),
                {"start": start, "end": end, "ended": list(ENDED), "cutoff": cutoff},
            ).first()
            if busy is not None:
                if busy.status not in ENDED:
                    return f"machine {busy.id} is {busy.status}"
                return f"machine {busy.id} changed at {busy.updated_at:%Y-%m-%d %H:%M}"
            last = conn.execute(text(f"SELECT max(id) FROM {name}")).scalar()
            folded = conn.execute(
                text("SELECT last_id FROM rollups WHERE name = :name"), {"name": FOLD}
            ).scalar()
        if last is not None and (folded is None or last > folded):
            return "its rows are not in the statistics yet (beat's fold)"
        return None


def _month_of(name: str) -> str:
    return f"{parts.start_of(name):%Y-%m}"


def _where(archive: str) -> str:
    if not archive:
        return "dropped"
    return (
        "kept in the fsm_archive schema" if archive == ARCHIVE_TABLE else f"archived to {archive}"
    )


def _short(error: BaseException) -> str:
    return str(getattr(error, "orig", None) or error).strip().splitlines()[0]
