"""Statistics without scanning the history: beat folds each new attempt into counters once
(`fold`), and `read` adds the few attempts recorded since (the tail) to them.

Machines are counted the same way: the live ones (running, paused) when read, the finished ones
from counters that beat folds from the changes triggers record (store.rollup).

The fold reads history ids in order, but ids are taken before their transactions commit, so a
row with a smaller id can appear after a larger one was read. The watermark therefore moves in
two steps: the fold notes the largest id it sees and which transactions are in flight (in
PostgreSQL, the next transaction id); only once all of this database's that were in flight
have ended, so that every id up to the noted one is committed or gone for good, does it fold
up to that id. Folded and unfolded are read in one REPEATABLE READ snapshot, so a fold that
commits meanwhile is counted once.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from datetime import timedelta
from typing import Any
from uuid import UUID

from fsm_celery.core.clock import aware
from fsm_celery.core.stats import Tally, saturated, saturated_cost, tallies
from fsm_celery.engine.runtime import Runtime
from fsm_celery.store import dialects
from fsm_celery.store import rollup as r
from fsm_celery.store.queries import AnyRow

CHUNK = 20_000  # attempts folded per transaction
TAIL = 200_000  # the most unfolded attempts a read adds (beat keeps the tail short)
SETTLE = timedelta(seconds=1)  # a noted id is folded no sooner (see the module's docstring)
FINISHED = r.FINISHED


class Stats:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def fold(self, most: int = 50) -> int:
        """Fold the machines' count changes into their counters, and the attempts
        recorded since the last fold into theirs, a chunk per transaction (at most `most`
        chunks); how many attempts were folded."""
        for _ in range(most):  # a backlog of count changes: a chunk a transaction
            with self._rt.db.begin() as conn:
                r.watermark_txn(conn)  # one fold at a time
                if r.fold_machine_counts_txn(conn) < r.COUNT_CHUNK:
                    break
        folded = 0
        for _ in range(most):
            now = self._rt.clock()
            with self._rt.db.begin() as conn:
                mark = r.watermark_txn(conn)
                dialect = dialects.of(conn)
                caught_up = mark.pending_id is None or mark.last_id >= mark.pending_id
                noted = aware(mark.updated_at) or now
                settled = mark.pending_snapshot is not None and (
                    noted + SETTLE <= now and dialect.ended(conn, mark.pending_snapshot)
                )
                if caught_up or not settled:
                    if caught_up:  # note where the next fold may go
                        r.set_watermark_txn(
                            conn,
                            pending_id=r.last_history_id_txn(conn),
                            pending_snapshot=dialect.snapshot(conn),
                            updated_at=now,
                        )
                    return folded
                chunk = r.summed_attempts_txn(conn, mark.last_id, mark.pending_id, CHUNK)
                r.add_state_stats_txn(conn, chunk.by_state)
                r.add_agent_usage_txn(conn, chunk.by_agent)
                last = chunk.last_id if chunk.attempts == CHUNK else mark.pending_id
                r.set_watermark_txn(conn, last_id=last)
            folded += chunk.attempts
        return folded

    def read(self) -> dict[str, Any]:
        """Machines by status, type and agent type; attempts per state (count, success rate,
        mean, p50, p95); completion rate per type; usage per type and agent; rejections."""
        with self._rt.db.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                through = r.folded_through_txn(conn)
                states = tallies(_stored(r.state_stats_txn(conn)))
                agents = {row.agent_id: row for row in r.agent_usage_txn(conn)}
                tail = r.summed_attempts_txn(conn, through, None, TAIL)
                counts = r.machine_counts_txn(conn)
                rejected = r.rejection_counts_txn(conn)
        for key, tally in tallies(tail.by_state).items():
            states.setdefault(key, Tally()).merge(tally)
        return {
            **_machines(counts),
            "states": _states(states),
            "usage": {
                "by_type": _usage_by_type(counts, states),
                "by_agent": _usage_by_agent(agents, tail.by_agent),
            },
            "rejected": {row.reason: row.total for row in rejected},
            "as_of": {
                "folded_through": through,
                "unfolded": tail.attempts,
                "complete": tail.attempts < TAIL,
            },
        }


def _stored(rows: Sequence[AnyRow]) -> list[tuple[str, str, int, int, int, int]]:
    return [
        (x.machine_type, x.state, x.bucket, x.attempts, x.successes, x.duration_ms) for x in rows
    ]


def _machines(counts: Sequence[r.Count]) -> dict[str, Any]:
    by_type: dict[str, dict[str, int]] = defaultdict(dict)
    by_status: Counter[str] = Counter()
    by_agent_type: Counter[str] = Counter()
    for row in counts:
        by_type[row.type][row.status] = by_type[row.type].get(row.status, 0) + row.total
        by_status[row.status] += row.total
        by_agent_type[row.agent_type] += row.total
    completion = {}
    for machine_type, statuses in by_type.items():
        ended = sum(statuses.get(s, 0) for s in FINISHED)
        if ended:
            completion[machine_type] = round(statuses.get("completed", 0) / ended, 4)
    return {
        "machines": dict(by_type),
        "by_status": dict(by_status),
        "by_type": {t: sum(s.values()) for t, s in by_type.items()},
        "by_agent_type": dict(by_agent_type),
        "completion_rate": completion,
    }


def _states(states: dict[tuple[str, str], Tally]) -> dict[str, dict[str, Any]]:
    shown: dict[str, dict[str, Any]] = defaultdict(dict)
    for (machine_type, state), tally in sorted(states.items()):
        shown[machine_type][state] = tally.summary()
    return dict(shown)


def _usage_by_type(
    counts: Sequence[r.Count], states: dict[tuple[str, str], Tally]
) -> dict[str, dict[str, Any]]:
    usage: dict[str, dict[str, Any]] = defaultdict(lambda: {"tokens": 0, "cost": 0.0})
    for row in counts:
        entry = usage[row.type]
        entry["tokens"] = saturated(entry["tokens"] + int(row.tokens or 0))
        entry["cost"] = saturated_cost(entry["cost"] + float(row.cost or 0))
    for (machine_type, _), tally in states.items():
        usage[machine_type]["attempts"] = usage[machine_type].get("attempts", 0) + tally.attempts
    return dict(usage)


def _usage_by_agent(
    folded: dict[UUID, AnyRow], tail: list[tuple[UUID, int, int, float]]
) -> dict[str, dict[str, Any]]:
    usage = {
        str(agent): {
            "tokens": int(row.tokens),
            "cost": saturated_cost(float(row.cost)),  # stored before it saturated: inf
            "attempts": row.attempts,
        }
        for agent, row in folded.items()
    }
    for agent, attempts, tokens, cost in tail:
        entry = usage.setdefault(str(agent), {"tokens": 0, "cost": 0.0, "attempts": 0})
        entry["tokens"] = saturated(entry["tokens"] + tokens)
        entry["cost"] = saturated_cost(entry["cost"] + cost)
        entry["attempts"] += attempts
    return usage
