"""The history's monthly partitions on PostgreSQL: a machine's rows in its creation month's, its
reads pruned to it; the retention archives and removes a month only once all its machines
ended (and the statistics folded it), puts back a month a machine came back to, and never runs
twice at once."""

from __future__ import annotations

import csv
import gzip
import io
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Connection, event, select, text

from fsm_celery.core.admin import Action, Command
from fsm_celery.engine.retention import Outcome
from fsm_celery.exceptions import ARCHIVED, CommandRefused, StepNotFound
from fsm_celery.store import partitions
from fsm_celery.store import queries as q
from fsm_celery.store.partitions import HISTORY, REJECTED
from fsm_celery.store.tables import machines
from tests.inprocess.conftest import Fsm, ack

CONTEXT = {"projectName": "sla-api", "githubIssue": 7, "bugDescription": "login fails"}
DAY = timedelta(days=1)


def _month_ago(months: int, day: int = 10) -> datetime:
    at = partitions.month(datetime.now(UTC))
    for _ in range(months):
        at = (at - DAY).replace(day=1)
    return at.replace(day=day, hour=12)


@pytest.fixture
def old(fsm: Fsm) -> Fsm:
    """The engine with the history's months of the last two years made (as a database that has
    run that long has them)."""
    now = datetime.now(UTC)
    partitions.ensure(fsm.engine.db, HISTORY, _month_ago(24), now)
    partitions.ensure(fsm.engine.db, REJECTED, _month_ago(24), now)
    return fsm


def _run(
    fsm: Fsm, at: datetime, finish: bool = True, machine_type: str = "cto_fix_bug"
) -> uuid.UUID:
    """A machine started at `at`, run to its end (or left at its first state)."""
    fsm.clock.now = at
    agent_id = uuid.uuid4()
    agent = fsm.agent(str(agent_id))
    mid = fsm.start(
        machine_type, CONTEXT if machine_type == "cto_fix_bug" else {}, agent_id=agent_id
    )
    while finish and (tasks := agent.tasks()) and fsm.machine(mid).status == "running":
        fsm.clock.advance(30)
        fsm.receive(ack(tasks[0]))
    return mid


def _fold(fsm: Fsm) -> None:
    """The statistics' fold, caught up (it settles a second after noting where to)."""
    fsm.clock.now = datetime.now(UTC)
    for _ in range(3):
        fsm.engine.stats.fold(most=100_000)
        fsm.clock.advance(2)


def _partition_of(conn: Connection, mid: uuid.UUID) -> set[str]:
    rows = conn.execute(
        text(
            "SELECT DISTINCT tableoid::regclass::text FROM state_transitions WHERE machine_id = :m"
        ),
        {"m": mid},
    )
    return {r[0] for r in rows}


def _names(fsm: Fsm, table: str = HISTORY) -> set[str]:
    return {p.name for p in fsm.engine.retention.months()[table]}


def _history_month(done: list[Outcome], month: str) -> Outcome:
    """The run's outcome for that month of the history (YYYY-MM)."""
    [found] = [o for o in done if (o.table, o.month) == (HISTORY, month)]
    return found


def _outcomes(done: list[Outcome]) -> dict[str, tuple[str, str]]:
    return {f"{o.table} {o.month}": (o.action, o.detail) for o in done}


def test_a_machines_rows_lie_in_its_creation_month_and_its_reads_open_that_one(old: Fsm) -> None:
    start = partitions.month(_month_ago(3)) - timedelta(seconds=20)  # the end of a month
    mid = _run(old, start)  # its transitions written in the next month
    assert old.machine(mid).status == "completed"
    with old.engine.db.connect() as conn:
        assert _partition_of(conn, mid) == {partitions.name(HISTORY, partitions.month(start))}
        rows = conn.execute(select(text("*")).select_from(text("state_transitions"))).all()
        assert {r.created_at.month for r in rows if r.machine_id == mid} == {
            start.month,
            (start + DAY).month,
        }
    history = old.history(mid)
    assert [h.attempt for h in history] == list(range(len(history)))

    # the statement that reads it scans one partition: the others are never executed
    executed: list[tuple[str, Any]] = []

    def capture(_conn: Any, _cursor: Any, statement: str, params: Any, *_: Any) -> None:
        executed.append((statement, params))

    event.listen(old.engine.db, "before_cursor_execute", capture)
    try:
        with old.engine.db.connect() as conn:
            q.history_txn(conn, mid)
    finally:
        event.remove(old.engine.db, "before_cursor_execute", capture)
    [(statement, params)] = [(s, p) for s, p in executed if "state_transitions" in s]
    with old.engine.db.connect() as conn:
        cursor = conn.connection.cursor()
        cursor.execute("EXPLAIN (ANALYZE, COSTS OFF, TIMING OFF) " + statement, params)
        plan = [line for (line,) in cursor.fetchall()]
    scanned = [
        line for line in plan if "state_transitions_p" in line and "never executed" not in line
    ]
    assert len(scanned) == 1, "\n".join(plan)
    assert partitions.name(HISTORY, partitions.month(start)) in scanned[0]


def test_a_month_whose_machines_all_ended_is_archived_to_a_file_and_removed(
    old: Fsm, tmp_path: Path
) -> None:
    oldest = [_run(old, _month_ago(14, day)) for day in (3, 20)]
    held = [_run(old, _month_ago(13)), _run(old, _month_ago(13, 5), finish=False)]
    recent = _run(old, _month_ago(1))
    _fold(old)
    stats_before = old.engine.stats.read()["states"]["cto_fix_bug"]
    rows_of = {mid: len(old.history(mid)) for mid in oldest}

    done = old.engine.retention.run(retention_days=45, archive=str(tmp_path))

    outcomes = _outcomes(done)
    month14, month13 = f"{_month_ago(14):%Y-%m}", f"{_month_ago(13):%Y-%m}"
    assert outcomes[f"{HISTORY} {month14}"][0] == "archived"
    assert outcomes[f"{HISTORY} {month13}"] == ("held", f"machine {held[1]} is running")
    assert not any(o.month >= f"{_month_ago(1):%Y-%m}" for o in done if o.table == HISTORY)
    gone = partitions.name(HISTORY, partitions.month(_month_ago(14)))
    assert gone not in _names(old)
    # the file: PostgreSQL's CSV of each of the month's rows, whole
    path = tmp_path / f"{gone}.csv.gz"
    with gzip.open(path, "rt", newline="") as archived:
        records = list(csv.DictReader(io.StringIO(archived.read())))
    assert len(records) == sum(rows_of.values())
    assert {r["machine_id"] for r in records} == {str(mid) for mid in oldest}
    assert _history_month(done, month14).rows == len(records)
    assert not list(tmp_path.glob(".*partial"))
    # the machines stay, their history is gone, and they can no longer be changed
    assert old.machine(oldest[0]).status == "completed"
    assert old.history(oldest[0]) == []
    with pytest.raises(CommandRefused, match=ARCHIVED.split(" (")[0]):
        old.engine.admin.command(oldest[0], Command(Action.RETRY, actor="ops"))
    with pytest.raises(StepNotFound, match="archived"):
        old.engine.rewind.rewind(oldest[0], 1, actor="ops", reason="again")
    # the others' are whole, and the statistics still count the archived attempts
    assert len(old.history(held[0])) > 1 and len(old.history(recent)) > 1
    assert old.engine.stats.read()["states"]["cto_fix_bug"] == stats_before


def test_a_month_not_yet_in_the_statistics_or_changed_within_the_retention_stays(old: Fsm) -> None:
    mid = _run(old, _month_ago(14))
    month = f"{_month_ago(14):%Y-%m}"
    old.clock.now = datetime.now(UTC)
    found = _history_month(old.engine.retention.run(retention_days=45), month)
    assert (found.action, found.detail) == (
        "held",
        "its rows are not in the statistics yet (beat's fold)",
    )
    _fold(old)
    with old.engine.db.begin() as conn:  # an operator touched it ten days ago
        conn.execute(
            machines.update()
            .where(machines.c.id == mid)
            .values(updated_at=datetime.now(UTC) - 10 * DAY)
        )
    found = _history_month(old.engine.retention.run(retention_days=45), month)
    assert found.action == "held" and found.detail.startswith(f"machine {mid} changed at")
    assert len(old.history(mid)) > 1


def test_a_dry_run_changes_nothing_and_table_archives_keep_the_month(old: Fsm) -> None:
    mid = _run(old, _month_ago(14))
    rows = len(old.history(mid))
    _fold(old)
    month = f"{_month_ago(14):%Y-%m}"
    name = partitions.name(HISTORY, partitions.month(_month_ago(14)))

    dry = _history_month(old.engine.retention.run(45, "table", dry_run=True), month)
    assert (dry.action, dry.detail) == ("would go", "kept in the fsm_archive schema")
    assert name in _names(old) and len(old.history(mid)) == rows

    kept = _history_month(old.engine.retention.run(45, "table"), month)
    assert (kept.action, kept.detail) == ("kept", f"{partitions.ARCHIVE_SCHEMA}.{name}")
    assert name not in _names(old)
    with old.engine.db.connect() as conn:
        archived = conn.execute(
            text(f"SELECT count(*) FROM {partitions.ARCHIVE_SCHEMA}.{name} WHERE machine_id = :m"),
            {"m": mid},
        ).scalar_one()
    assert archived == rows


def test_a_month_left_detached_is_put_back_when_a_machine_of_it_works_again(old: Fsm) -> None:
    mid = _run(old, _month_ago(14))
    _fold(old)
    name = partitions.name(HISTORY, partitions.month(_month_ago(14)))
    [month] = [p for p in old.engine.retention.months()[HISTORY] if p.name == name]
    partitions.detach(old.engine.db, month)  # a run stopped here...
    with old.engine.db.begin() as conn:  # ...and the machine was set to work again meanwhile
        conn.execute(machines.update().where(machines.c.id == mid).values(status="paused"))

    found = _history_month(old.engine.retention.run(45), f"{_month_ago(14):%Y-%m}")
    assert (found.action, found.detail) == ("held", f"machine {mid} is paused (put back)")
    assert name in _names(old)
    assert len(old.history(mid)) > 1

    with old.engine.db.begin() as conn:
        conn.execute(machines.update().where(machines.c.id == mid).values(status="completed"))
    partitions.detach(old.engine.db, month)
    found = _history_month(old.engine.retention.run(45), f"{_month_ago(14):%Y-%m}")
    assert found.action == "dropped"  # FSM_HISTORY_ARCHIVE unset
    with old.engine.db.connect() as conn:
        assert partitions.detached(conn, HISTORY) == []


def test_rejected_messages_months_past_their_retention_are_dropped(old: Fsm) -> None:
    with old.engine.db.begin() as conn:
        for at in (_month_ago(3), datetime.now(UTC)):
            conn.execute(
                text(
                    "INSERT INTO rejected_messages (received_at, reason, detail, payload)"
                    " VALUES (:at, 'malformed', 'd', 'p')"
                ),
                {"at": at},
            )
    old.clock.now = datetime.now(UTC)
    done = _outcomes(old.engine.retention.run())  # history kept forever; rejected: 7 days
    assert done[f"{REJECTED} {_month_ago(3):%Y-%m}"] == ("dropped", "")
    assert not any(key.startswith(HISTORY) for key in done)
    with old.engine.db.connect() as conn:
        left = conn.execute(text("SELECT received_at FROM rejected_messages")).scalars().all()
    assert len(left) == 1 and left[0] > datetime.now(UTC) - DAY


def test_the_months_ahead_are_made_and_one_run_works_at_a_time(old: Fsm) -> None:
    last = partitions.ahead(datetime.now(UTC))
    name = partitions.name(HISTORY, last)
    [month] = [p for p in old.engine.retention.months()[HISTORY] if p.name == name]
    partitions.detach(old.engine.db, month)
    partitions.drop(old.engine.db, name)
    assert name not in _names(old)

    with old.engine.db.begin() as conn:
        conn.execute(text("INSERT INTO liveness (name, at) VALUES ('history-retention', now())"))
    with old.engine.db.connect() as other, other.begin():  # another run holds the lease
        other.execute(text("SELECT 1 FROM liveness WHERE name = 'history-retention' FOR UPDATE"))
        assert old.engine.retention.run() == []
        assert name not in _names(old)
    old.clock.now = datetime.now(UTC)
    done = old.engine.retention.run()
    assert ("made", "") in _outcomes(done).values()
    assert name in _names(old)


@pytest.fixture
def lite(fsm_sqlite: Fsm) -> Iterator[Fsm]:
    yield fsm_sqlite


def test_sqlite_keeps_one_table(lite: Fsm) -> None:
    mid = _run(lite, datetime.now(UTC), machine_type="test_pair")
    assert lite.engine.retention.months() == {}
    assert lite.engine.retention.run(retention_days=1) == []
    assert len(lite.history(mid)) > 1


def test_an_archive_file_is_its_owners_alone_and_never_written_through_a_planted_link(
    fsm: Fsm, tmp_path: Path
) -> None:
    table = f"archive_probe_{uuid.uuid4().hex[:8]}"
    with fsm.engine.db.begin() as conn:
        conn.execute(text(f"CREATE TABLE {table} AS SELECT g AS id FROM generate_series(1, 3) g"))
    victim = tmp_path / "victim"
    victim.write_text("someone else's file")
    archive = tmp_path / "archive"
    archive.mkdir()
    (archive / f".{table}.csv.gz.partial").symlink_to(victim)  # the name it used to write to
    try:
        path, rows = partitions.archive_to_file(fsm.engine.db, table, archive)
    finally:
        with fsm.engine.db.begin() as conn:
            conn.execute(text(f"DROP TABLE {table}"))
    assert rows == 3 and victim.read_text() == "someone else's file"
    assert path.stat().st_mode & 0o777 == 0o600
    with gzip.open(path, "rt") as archived:
        assert archived.read().split() == ["id", "1", "2", "3"]
    assert [p.name for p in archive.iterdir() if not p.is_symlink()] == [path.name]
