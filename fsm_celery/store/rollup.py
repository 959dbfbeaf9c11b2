"""The statistics' rows: attempts folded from the history into state_stats and agent_usage,
the fold's watermark, and what is not folded yet (the tail); finished machines' counts folded
from the changes the triggers of migration 0011 record. Each helper takes the connection
and never commits; fsm_celery.engine.stats owns the transactions and explains the watermark."""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from typing import Any, NamedTuple
from uuid import UUID

from sqlalchemy import (
    BigInteger,
    ColumnElement,
    Connection,
    Float,
    Select,
    case,
    delete,
    func,
    literal,
    select,
    text,
    update,
)

from fsm_celery.core.stats import (
    GROWTH,
    MAX_BUCKET,
    MOST,
    MOST_COST,
    NO_DURATION,
    bucket_of,
    saturated,
    saturated_cost,
)
from fsm_celery.store import dialects
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.tables import (
    agent_usage,
    machine_count_changes,
    machine_counts,
    machines,
    rejected_messages,
    rollups,
    state_stats,
    transitions,
)

HISTORY = "history"
ROW_COST = MOST_COST / 2**63  # ~1.9e289, far past any machine's (MAX_COST: 1e12)
ATTEMPTS = ("ack", "timeout")  # the history rows that end an agent's attempt
FINISHED = ("completed", "failed", "cancelled")  # a machine's ends (the completion rate's)
COUNT_CHUNK = 10_000  # machine count changes folded a transaction
# The memory the attempts' sums may take before PostgreSQL spills them to disk: its 4 MB default
# sorts 200,000 attempts on disk for the grouping sets (twice); with this they are hashed, in
# one pass. Per statement, in its transaction only (SET LOCAL).
WORK_MEM = "32MB"


class Count(NamedTuple):
    """Machines of one type, agent type and status, and their usage."""

    type: str
    agent_type: str
    status: str
    total: int
    tokens: int
    cost: float


def watermark_txn(conn: Connection) -> AnyRow:
    """The fold's row, locked (made on first use): one fold at a time."""
    conn.execute(
        dialects.of(conn)
        .insert(rollups)
        .values(name=HISTORY, last_id=0)
        .on_conflict_do_nothing(index_elements=["name"])
    )
    row: AnyRow = conn.execute(
        select(rollups).where(rollups.c.name == HISTORY).with_for_update()
    ).one()
    return row


def folded_through_txn(conn: Connection) -> int:
    """The last history id folded (0: none yet)."""
    last = conn.execute(select(rollups.c.last_id).where(rollups.c.name == HISTORY)).scalar()
    return int(last or 0)


def set_watermark_txn(conn: Connection, **fields: object) -> None:
    """Set the watermark's fields: last_id (folded through), or pending_id, pending_snapshot and
    updated_at (noted then)."""
    conn.execute(update(rollups).where(rollups.c.name == HISTORY).values(**fields))


def last_history_id_txn(conn: Connection) -> int:
    return int(conn.execute(select(func.max(transitions.c.id))).scalar() or 0)


def attempts_txn(conn: Connection, after: int, upto: int | None, limit: int) -> Sequence[AnyRow]:
    """The attempts recorded after history id `after` (up to `upto`), oldest first, with their
    machine's type."""
    query = (
        select(
            transitions.c.id,
            machines.c.type,
            transitions.c.from_state,
            transitions.c.success,
            transitions.c.duration_ms,
            transitions.c.agent_id,
            transitions.c.tokens_used,
            transitions.c.cost,
        )
        .select_from(transitions.join(machines, machines.c.id == transitions.c.machine_id))
        .where(transitions.c.id > after, transitions.c.event.in_(ATTEMPTS))
        .order_by(transitions.c.id)
        .limit(limit)
    )
    if upto is not None:
        query = query.where(transitions.c.id <= upto)
    return conn.execute(query).all()


class Attempts(NamedTuple):
    """Attempts summed: per (type, state, duration bucket) their count, successes and summed
    durations; per agent their count, tokens and cost; how many, and the last history id."""

    by_state: list[tuple[str, str, int, int, int, int]]
    by_agent: list[tuple[UUID, int, int, float]]
    attempts: int
    last_id: int | None


def summed_attempts_txn(conn: Connection, after: int, upto: int | None, limit: int) -> Attempts:
    """The attempts after history id `after` (up to `upto`; at most `limit`, oldest first),
    summed. PostgreSQL sums them itself, so a read of 200,000 unfolded attempts moves a few
    hundred rows, not 200,000, into Python; its duration buckets are bucket_of's exactly (the
    same libm logarithm, checked for every duration up to 3,000,000 ms); a double's sum past its
    range is an error there, so costs are summed in two parts (see _cost), and the sums
    saturate here as Python's do. SQLite's are summed here."""
    if conn.dialect.name != "postgresql":
        rows = attempts_txn(conn, after, upto, limit)
        return Attempts(by_state(rows), by_agent(rows), len(rows), rows[-1].id if rows else None)
    conn.execute(text(f"SET LOCAL work_mem = '{WORK_MEM}'"))  # see WORK_MEM
    found = conn.execute(
        text(_SUMMED.format(upto="" if upto is None else "AND t.id <= :upto")),
        {"after": after, "upto": upto, "limit": limit},
    ).all()
    states = [
        (r.type, r.state, r.bucket, r.n, int(r.ok), saturated(int(r.ms)))
        for r in found
        if r.by_state == 0
    ]
    agents = [
        (r.agent_id, r.n, saturated(int(r.tokens)), saturated_cost(_cost(r)))
        for r in found
        if r.by_agent == 0 and r.agent_id is not None
    ]
    [total] = [r for r in found if r.by_state and r.by_agent]
    return Attempts(states, agents, total.n, total.last)


def _cost(summed: AnyRow) -> float:
    """An agent's summed cost: the rows of a cost up to ROW_COST summed as doubles, which no
    count of them can overflow, plus the others (stored before the bounds: past it, infinite or
    NaN) summed as numeric, which only they pay for."""
    unbounded = summed.unbounded_cost
    return float(summed.cost) + (0.0 if unbounded is None else float(unbounded))


_SUMMED = f"""
SELECT GROUPING(type, state, bucket) AS by_state, GROUPING(agent_id) AS by_agent,
    type, state, bucket, agent_id, count(*) AS n, count(*) FILTER (WHERE success) AS ok,
    coalesce(sum(duration_ms), 0) AS ms, coalesce(sum(tokens_used), 0) AS tokens,
    coalesce(sum(cost) FILTER (WHERE cost <= {ROW_COST!r}), 0) AS cost,
    sum(CAST(cost AS numeric)) FILTER (WHERE NOT cost <= {ROW_COST!r}) AS unbounded_cost,
    max(id) AS last
FROM (
    SELECT tail.*, m.type, CASE WHEN duration_ms IS NULL THEN {NO_DURATION}
        WHEN duration_ms < 1 THEN 0
        ELSE LEAST({MAX_BUCKET}, CAST(floor(ln(CAST(duration_ms AS double precision))
            / ln(CAST({GROWTH!r} AS double precision))) AS integer) + 1) END AS bucket
    FROM (
        SELECT id, machine_id, coalesce(from_state, '') AS state, success, duration_ms,
            agent_id, tokens_used, cost
        FROM state_transitions t
        WHERE t.id > :after {{upto}} AND t.event IN ({", ".join(f"'{e}'" for e in ATTEMPTS)})
        ORDER BY t.id LIMIT :limit
    ) AS tail JOIN state_machines m ON m.id = tail.machine_id
) AS bucketed
GROUP BY GROUPING SETS ((type, state, bucket), (agent_id), ())
"""


def by_state(rows: Iterable[AnyRow]) -> list[tuple[str, str, int, int, int, int]]:
    """Attempts rows summed per (type, state, duration bucket)."""
    found: Counter[tuple[str, str, int]] = Counter()
    successes: Counter[tuple[str, str, int]] = Counter()
    durations: Counter[tuple[str, str, int]] = Counter()
    for row in rows:
        key = (row.type, row.from_state or "", bucket_of(row.duration_ms))
        found[key] += 1
        successes[key] += int(row.success)
        durations[key] += row.duration_ms or 0
    return [(*key, n, successes[key], saturated(durations[key])) for key, n in found.items()]


def by_agent(rows: Iterable[AnyRow]) -> list[tuple[UUID, int, int, float]]:
    """Attempts rows summed per agent (attempts, tokens, cost)."""
    found: dict[UUID, list[float]] = defaultdict(lambda: [0, 0, 0.0])
    for row in rows:
        if row.agent_id is not None:
            total = found[row.agent_id]
            total[0] += 1
            total[1] += row.tokens_used
            total[2] += row.cost
    return [
        (agent, int(n), saturated(int(tokens)), saturated_cost(cost))
        for agent, (n, tokens, cost) in found.items()
    ]


def add_state_stats_txn(
    conn: Connection, rows: Iterable[tuple[str, str, int, int, int, int]]
) -> None:
    """Add (type, state, bucket, attempts, successes, duration_ms) to the stored counters."""
    values = [
        {
            "machine_type": t,
            "state": s,
            "bucket": b,
            "attempts": a,
            "successes": ok,
            "duration_ms": ms,
        }
        for t, s, b, a, ok, ms in rows
    ]
    if not values:
        return
    insert = dialects.of(conn).insert(state_stats)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=["machine_type", "state", "bucket"],
            set_={
                name: _plus(state_stats.c[name], insert.excluded[name], MOST)
                for name in ("attempts", "successes", "duration_ms")
            },
        ),
        values,
    )


def add_agent_usage_txn(conn: Connection, rows: Iterable[tuple[UUID, int, int, float]]) -> None:
    """Add (agent, attempts, tokens, cost) to the stored counters."""
    values = [{"agent_id": a, "attempts": n, "tokens": t, "cost": c} for a, n, t, c in rows]
    if not values:
        return
    insert = dialects.of(conn).insert(agent_usage)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=["agent_id"],
            set_={
                "attempts": _plus(agent_usage.c.attempts, insert.excluded.attempts, MOST),
                "tokens": _plus(agent_usage.c.tokens, insert.excluded.tokens, MOST),
                "cost": _plus(agent_usage.c.cost, insert.excluded.cost, MOST_COST),
            },
        ),
        values,
    )


def _plus(stored: ColumnElement[Any], added: ColumnElement[Any], most: float) -> ColumnElement[Any]:
    """stored + added, saturated at most: compared before adding (both are >= 0), as the sum
    itself would overflow and fail the fold."""
    top = literal(most, Float() if isinstance(most, float) else BigInteger())
    return case((stored > top - added, top), else_=stored + added)


def state_stats_txn(conn: Connection) -> Sequence[AnyRow]:
    return conn.execute(select(state_stats)).all()


def agent_usage_txn(conn: Connection) -> Sequence[AnyRow]:
    return conn.execute(select(agent_usage)).all()


def machine_counts_txn(conn: Connection) -> list[Count]:
    """Machines counted, and their usage summed, by type, agent type and status: the folded
    counters (machine_counts) plus the changes not folded yet, live and finished machines alike
    (migration 0025), so that a read costs the same with a million machines waiting; read in one
    snapshot, a fold that commits meanwhile is counted once."""
    x = machine_count_changes.c
    folded = _stored_counts(conn)
    pending = conn.execute(
        _by_status(
            x,
            func.sum(x.machines).label("machines"),
            func.sum(x.tokens).label("tokens"),  # numeric in PostgreSQL: no overflow
            func.sum(x.cost).label("cost"),  # each at most ROW_COST (the triggers')
        )
    ).all()
    return [n for n in _added(folded, pending).values() if n.total > 0]


def _by_status(c: Any, *sums: Any) -> Select[Any]:
    """`sums` over the rows of `c`'s table, by machine type, agent type and status."""
    return select(c.type, c.agent_type, c.status, *sums).group_by(c.type, c.agent_type, c.status)


def fold_machine_counts_txn(conn: Connection, most: int = COUNT_CHUNK) -> int:
    """Move the oldest changes committed so far (at most `most`) into machine_counts (those of
    transactions still in flight are not visible: the next fold takes them); how many it
    moved. On PostgreSQL they are summed by key in the statement that deletes them, so a
    backlog (a bulk start, beat stopped for a while) reaches Python as a few rows."""
    x = machine_count_changes.c
    oldest = select(x.id).order_by(x.id).limit(most).scalar_subquery()
    moving = delete(machine_count_changes).where(x.id.in_(oldest))
    if conn.dialect.name == "postgresql":
        moved = moving.returning(*(x[name] for name in _COUNTED)).cte("moved")
        changes = conn.execute(
            select(
                moved.c.type,
                moved.c.agent_type,
                moved.c.status,
                func.sum(moved.c.machines).label("machines"),
                func.sum(moved.c.tokens).label("tokens"),
                func.sum(moved.c.cost).label("cost"),
                func.count().label("rows"),
            ).group_by(moved.c.type, moved.c.agent_type, moved.c.status)
        ).all()
        count = sum(int(r.rows) for r in changes)
    else:
        changes = conn.execute(moving.returning(*(x[name] for name in _COUNTED))).all()
        count = len(changes)
    if not changes:
        return 0
    keys = {(r.type, r.agent_type, r.status) for r in changes}
    stored = {k: n for k, n in _stored_counts(conn, lock=True).items() if k in keys}
    rows = [
        {
            "type": n.type,
            "agent_type": n.agent_type,
            "status": n.status,
            "machines": n.total,
            "tokens": n.tokens,
            "cost": n.cost,
        }
        for n in _added(stored, changes).values()
    ]
    insert = dialects.of(conn).insert(machine_counts)
    conn.execute(
        insert.on_conflict_do_update(
            index_elements=["type", "agent_type", "status"],
            set_={name: insert.excluded[name] for name in ("machines", "tokens", "cost")},
        ),
        rows,
    )
    return count


def _stored_counts(conn: Connection, lock: bool = False) -> dict[tuple[str, str, str], Count]:
    """machine_counts' rows by their key (locked: the fold's)."""
    query = select(machine_counts)
    return {
        (r.type, r.agent_type, r.status): Count(
            r.type, r.agent_type, r.status, r.machines, r.tokens, r.cost
        )
        for r in conn.execute(query.with_for_update() if lock else query)
    }


_COUNTED = ("type", "agent_type", "status", "machines", "tokens", "cost")


def _added(
    counts: dict[tuple[str, str, str], Count], changes: Iterable[Any]
) -> dict[tuple[str, str, str], Count]:
    """The counts with the changes added (a sum saturates rather than overflow; never below 0).
    The changes are summed by key first: a fold may return a machine's -1 before its +1."""
    summed: dict[tuple[str, str, str], list[Any]] = {}
    for r in changes:
        total = summed.setdefault((r.type, r.agent_type, r.status), [0, 0, 0.0])
        total[0] += int(r.machines)
        total[1] += int(r.tokens)
        total[2] += float(r.cost)
    added = dict(counts)
    for key, (count, tokens, cost) in summed.items():
        was = added.get(key) or Count(*key, 0, 0, 0.0)
        added[key] = was._replace(
            total=max(0, was.total + count),
            tokens=max(0, saturated(was.tokens + tokens)),
            cost=max(0.0, saturated_cost(was.cost + cost)),
        )
    return added


def rejection_counts_txn(conn: Connection) -> Sequence[AnyRow]:
    return conn.execute(
        select(rejected_messages.c.reason, func.count().label("total")).group_by(
            rejected_messages.c.reason
        )
    ).all()
