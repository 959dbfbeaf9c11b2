"""The history's monthly partitions on PostgreSQL: made ahead of need, and past their retention
detached, archived and removed, with no lock that stops a transition.

`state_transitions` is partitioned by its machine's creation time (a machine's rows all lie in
one partition: store.tables), `rejected_messages` by the time each was received; one partition
per UTC month, named `<table>_pYYYY_MM`.

There is no DEFAULT partition: it would have to be scanned whenever a partition is attached, and
it forbids `DETACH PARTITION ... CONCURRENTLY`. So the months ahead are made in advance (AHEAD,
by the migration and by beat's hourly job), each by `CREATE TABLE ... (LIKE ...)` then `ATTACH
PARTITION`, which locks the parent in SHARE UPDATE EXCLUSIVE mode (no reader or writer waits),
where `CREATE TABLE ... PARTITION OF` would lock it ACCESS EXCLUSIVE. A partition leaves by
`DETACH PARTITION ... CONCURRENTLY` (the same lock, then it waits for the transactions that
might still see it), and is dropped only once detached: dropping it attached would lock the
parent ACCESS EXCLUSIVE. The statements that run in a transaction wait LOCK_TIMEOUT at most
for their locks, then give up until the next run (`SET LOCAL`: behind a transaction pooler a
session's setting would outlive it on some other client's session).
"""

from __future__ import annotations

import gzip
import os
import re
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import BinaryIO
from weakref import WeakKeyDictionary

from sqlalchemy import Connection, Engine, text

HISTORY = "state_transitions"
REJECTED = "rejected_messages"
KEYS = {HISTORY: "machine_created_at", REJECTED: "received_at"}  # each table's partition key
AHEAD = 3  # months made beyond the current one
ARCHIVE_SCHEMA = "fsm_archive"  # where FSM_HISTORY_ARCHIVE=table keeps the detached months
LOCK_TIMEOUT = "1s"
NAME = re.compile(r"^(?P<parent>state_transitions|rejected_messages)_p(?P<y>\d{4})_(?P<m>\d{2})$")
_BOUND = re.compile(r"FROM \('(?P<start>[^']+)'\) TO \('(?P<end>[^']+)'\)")


def month(at: datetime) -> datetime:
    """The first instant of `at`'s month, in UTC."""
    at = at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)
    return at.replace(day=1, hour=0, minute=0, second=0, microsecond=0)


def next_month(start: datetime) -> datetime:
    return (
        start.replace(year=start.year + 1, month=1)
        if start.month == 12
        else start.replace(month=start.month + 1)
    )


def ahead(now: datetime) -> datetime:
    """The last month to have a partition made by now: AHEAD months past now's."""
    start = month(now)
    for _ in range(AHEAD):
        start = next_month(start)
    return start


def months(first: datetime, last: datetime) -> Iterator[datetime]:
    """Each month from first's to last's, both included."""
    at, end = month(first), month(last)
    while at <= end:
        yield at
        at = next_month(at)


def name(parent: str, start: datetime) -> str:
    return f"{parent}_p{start:%Y_%m}"


def is_partition(table_name: str) -> bool:
    """Whether a table is one of the months (for Alembic's comparison with the declared schema,
    which declares the parents only)."""
    return NAME.match(table_name) is not None


def include_name(table_name: str | None, type_: str, parent_names: object) -> bool:
    """Alembic's filter: the months are not in the declared schema (their parents are)."""
    return not (type_ == "table" and table_name is not None and is_partition(table_name))


@dataclass(frozen=True, slots=True)
class Partition:
    parent: str
    name: str
    start: datetime
    end: datetime
    rows: int  # PostgreSQL's estimate (pg_class.reltuples; -1: never analysed)
    size: int  # bytes, with its indexes
    pending: bool  # a DETACH ... CONCURRENTLY that was interrupted: to be finalized


def listed(conn: Connection, parent: str) -> list[Partition]:
    """The table's partitions, oldest first."""
    rows = conn.execute(
        text(
            "SELECT c.relname, pg_get_expr(c.relpartbound, c.oid) AS bound, c.reltuples,"
            " pg_total_relation_size(c.oid) AS size, i.inhdetachpending"
            " FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid"
            " WHERE i.inhparent = CAST(:parent AS regclass)"
        ),
        {"parent": parent},
    ).all()
    found = []
    for row in rows:
        bound = _BOUND.search(row.bound)
        if bound is None:  # not a range of ours (a DEFAULT partition someone added)
            continue
        found.append(
            Partition(
                parent,
                row.relname,
                datetime.fromisoformat(bound["start"]).astimezone(UTC),
                datetime.fromisoformat(bound["end"]).astimezone(UTC),
                int(row.reltuples),
                int(row.size),
                bool(row.inhdetachpending),
            )
        )
    return sorted(found, key=lambda p: p.start)


def detached(conn: Connection, parent: str) -> list[str]:
    """Months of the table left detached (a run that stopped between detaching one and
    archiving or dropping it), oldest first."""
    rows = conn.execute(
        text(
            "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace"
            " WHERE n.nspname = current_schema() AND c.relkind = 'r' AND NOT c.relispartition"
            " AND c.relname LIKE :pattern"
        ),
        {"pattern": f"{parent}\\_p%"},
    ).scalars()
    return sorted(r for r in rows if is_partition(r))


def create_statements(parent: str, start: datetime) -> list[str]:
    """A month's partition: a table like the parent, then attached (see the module's doc)."""
    table = name(parent, start)
    return [
        f"CREATE TABLE {table} (LIKE {parent} INCLUDING DEFAULTS INCLUDING STORAGE)",
        f"ALTER TABLE {parent} ATTACH PARTITION {table} "
        f"FOR VALUES FROM ('{start.isoformat()}') TO ('{next_month(start).isoformat()}')",
    ]


def ensure(db: Engine, parent: str, first: datetime, last: datetime) -> list[str]:
    """Make the table's partitions from first's month through last's that it lacks; the names
    made. Each in its own transaction, serialised with other processes doing the same."""
    made = []
    for start in months(first, last):
        with db.begin() as conn:
            conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
            conn.execute(
                text("SELECT pg_advisory_xact_lock(hashtextextended(:key, 0))"),
                {"key": f"fsm.partitions.{parent}"},
            )
            if any(p.start == start for p in listed(conn, parent)):
                continue
            for statement in create_statements(parent, start):
                conn.execute(text(statement))
        made.append(name(parent, start))
    return made


_READY: WeakKeyDictionary[Engine, set[tuple[str, datetime]]] = WeakKeyDictionary()


def ready(conn: Connection, parent: str, times: Iterable[datetime]) -> None:
    """Make sure the months of these times have their partitions before rows of them are
    written in the connection's transaction: beat makes them ahead, this covers a beat down for
    months (a row with no month to go to would fail its whole transaction). Asked once per
    month and process, on the caller's connection; a missing month is made from another (the
    caller's transaction goes on), which only a beat down that long ever needs."""
    known = _READY.setdefault(conn.engine, set())
    wanted = {(parent, month(at)) for at in times} - known
    if not wanted:
        return
    have = {p.start for p in listed(conn, parent)}
    for _, start in wanted:
        if start not in have:
            ensure(conn.engine, parent, start, start)
    known |= wanted


def detach(db: Engine, partition: Partition) -> None:
    """Detach a month without blocking the table's readers and writers (not in a transaction:
    DETACH ... CONCURRENTLY commits twice); an interrupted detach is finished. No lock timeout
    here: it would have to be set for the session, which behind a transaction pooler is some
    other client's; and none is needed, as what it waits for (SHARE UPDATE EXCLUSIVE) makes no
    reader or writer wait behind it."""
    how = "FINALIZE" if partition.pending else "CONCURRENTLY"
    with db.connect() as conn:
        conn = conn.execution_options(isolation_level="AUTOCOMMIT")
        conn.execute(
            text(f"ALTER TABLE {partition.parent} DETACH PARTITION {partition.name} {how}")
        )


def start_of(table: str) -> datetime:
    """The first instant of a month's partition, read from its name."""
    match = NAME.match(table)
    assert match is not None, table
    return datetime(int(match["y"]), int(match["m"]), 1, tzinfo=UTC)


def attach(db: Engine, parent: str, table: str) -> None:
    """Put a detached month back (its rows were found still needed)."""
    start = start_of(table)
    with db.begin() as conn:
        conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        conn.execute(text(create_statements(parent, start)[1]))


def empty(db: Engine, table: str) -> bool:
    with db.connect() as conn:
        return bool(conn.execute(text(f"SELECT NOT EXISTS (SELECT 1 FROM {table})")).scalar_one())


def archive_to_file(db: Engine, table: str, directory: Path) -> tuple[Path, int]:
    """Write a detached month to directory/<table>.csv.gz (PostgreSQL's CSV, a header line):
    written to a temporary file, synced, then renamed, so a file of that name is whole; the
    file and the rows written, checked against the table's count."""
    directory.mkdir(mode=0o700, parents=True, exist_ok=True)
    final = directory / f"{table}.csv.gz"
    # mkstemp: a name no one can guess, created exclusively (O_EXCL), never through a symlink,
    # readable by its owner alone (0600); the history holds every agent's outputs.
    fd, name = tempfile.mkstemp(prefix=f".{table}.csv.gz.", suffix=".partial", dir=directory)
    partial = Path(name)
    try:
        with os.fdopen(fd, "wb") as raw:
            written, expected = _copy_out(db, table, raw)
        if written != expected:
            raise RuntimeError(f"{table}: {written} rows written to its archive, {expected} in it")
        os.replace(partial, final)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    _fsync_directory(directory)
    return final, written


def _copy_out(db: Engine, table: str, raw: BinaryIO) -> tuple[int, int]:
    """The table's rows as gzipped CSV into raw, synced: the rows written, and its count."""
    with db.connect() as conn:
        expected = int(conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one())
        cursor = conn.connection.cursor()
        with gzip.GzipFile(fileobj=raw, mode="wb") as out:
            cursor.copy_expert(
                f"COPY (SELECT * FROM {table} ORDER BY id) TO STDOUT WITH (FORMAT csv, HEADER)",
                out,
            )
            written = cursor.rowcount
        raw.flush()
        os.fsync(raw.fileno())
        conn.rollback()
    return written, expected


def _fsync_directory(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def keep_as_table(db: Engine, table: str) -> str:
    """Move a detached month to the archive schema, out of the way of the next one: its name
    there."""
    with db.begin() as conn:
        conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {ARCHIVE_SCHEMA}"))
        conn.execute(text(f"ALTER TABLE {table} SET SCHEMA {ARCHIVE_SCHEMA}"))
    return f"{ARCHIVE_SCHEMA}.{table}"


def drop(db: Engine, table: str) -> None:
    """Drop a detached month (only its own lock: no other table's)."""
    with db.begin() as conn:
        conn.execute(text(f"SET LOCAL lock_timeout = '{LOCK_TIMEOUT}'"))
        conn.execute(text(f"DROP TABLE {table}"))
