"""The scan (beat runs it every second): attempts past their deadline time out, states whose
dispatch is due are entered; and the pruning of what is kept only for a while."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import timedelta
from typing import Any
from uuid import UUID

import sqlalchemy.exc
from sqlalchemy import Connection

from fsm_celery.core.attempt_events import Timeout
from fsm_celery.core.transition import Rejected, decide
from fsm_celery.engine.cancels import cancel_in_flight
from fsm_celery.engine.entry import Entry
from fsm_celery.engine.kinds import approval
from fsm_celery.engine.ports import Scanned
from fsm_celery.engine.runtime import Runtime
from fsm_celery.store import agents as agent_store
from fsm_celery.store import dialects
from fsm_celery.store import queries as q
from fsm_celery.store import schedules as schedule_store
from fsm_celery.store.sent import Sent
from fsm_celery.store.writes import Writes, snapshot

log = logging.getLogger(__name__)


class Scan:
    def __init__(self, runtime: Runtime, entry: Entry) -> None:
        self._rt = runtime
        self._entry = entry
        self._sent = Sent()  # what a scan that failed sent: the next one sends it not again

    def run(self, limit: int = 500) -> Scanned:
        """Time out attempts past their deadline and enter the states whose dispatch is due
        (since FSM_DISPATCH_GRACE_SECONDS: until then, an enter_state task is on its way).

        The database is the truth: this also repairs a dispatch lost with a killed worker, a
        dropped message or a flushed Redis. Rows another transaction holds are skipped. A
        scan whose write the database refuses goes on machine by machine, so that one machine
        it cannot write holds back no other (what the failed try sent is not sent again).
        """
        try:
            return self._scan(limit)
        except self._rt.transient:
            raise
        except Exception:
            log.exception("the scan's transaction failed; it goes on machine by machine")
        handled, next_states = 0, []
        for machine_id in self._candidates(limit):
            try:
                scanned = self._scan(limit, machine_id)
            except self._rt.transient:
                raise
            except Exception:
                log.exception("the scan could not write machine %s; it goes on", machine_id)
                continue
            handled += scanned.handled
            next_states += scanned.next
        return Scanned(handled, next_states)

    def _scan(self, limit: int, only: UUID | None = None) -> Scanned:
        writes = Writes(self._rt.clock(), sent=self._sent)
        grace = timedelta(seconds=self._rt.settings.dispatch_grace_seconds)
        with self._rt.transaction(writes) as conn:
            # Found without a lock, then locked with their ancestors in the one lock order
            # (docs/fan-out.md), skipping rows others hold: the scan waits for no transaction.
            # A machine is handled only if all its ancestors were had (its end joins its
            # parent), and if still overdue or due once locked. One scan at a time: a child it
            # holds without its parent then blocks no other scan's cascade.
            dialects.of(conn).lock_key(conn, "fsm-scan")
            late, ready = q.scan_candidates_txn(conn, writes.now, writes.now - grace, limit, only)
            rows = q.lock_machines_txn(conn, [*late, *ready], skip_locked=True)
            held = {i for i in rows if q.with_ancestors(rows, i)}
            overdue = [rows[i] for i in late if i in held and q.overdue(rows[i], writes.now)]
            due = [rows[i] for i in ready if i in held and q.due(rows[i], writes.now - grace)]
            if only is None:  # counted before this scan moves anything
                self._entry.reconcile_txn(conn, rows, writes)
            for row in overdue:
                _contained(row, self._time_out, conn, row, writes)
            for row in due:
                _contained(row, self._entry.enter_txn, conn, rows, row, writes)
            self._entry.enter_due_txn(conn, rows, writes)
            self._entry.send_and_write(conn, writes)
            schedule_store.touch_txn(conn, "scan", writes.now)  # beat is alive (fsm-celery doctor)
        return Scanned(len(overdue) + len(due), writes.next())

    def _candidates(self, limit: int) -> list[UUID]:
        """The machines a scan would handle now, read without a lock."""
        now = self._rt.clock()
        grace = timedelta(seconds=self._rt.settings.dispatch_grace_seconds)
        with self._rt.db.connect() as conn:
            late, ready = q.scan_candidates_txn(conn, now, now - grace, limit)
        return list(dict.fromkeys([*late, *ready]))

    def _time_out(self, conn: Connection, row: q.AnyRow, writes: Writes) -> None:
        definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        decision = decide(definition, snapshot(row), Timeout(row.current_state, row.attempt))
        assert not isinstance(decision, Rejected)  # the query chose dispatched attempts
        writes.transition(row, decision, "timeout")
        state = definition.state(row.current_state)
        if state.approval is not None:
            approval.close_txn(conn, row.id, "timed_out", writes.now)
        if state.awaits:  # people or an outside event were waited for: no agent to tell
            return
        why = "timed out: no ack or heartbeat before its deadline"
        cancel_in_flight(writes, row, self._rt.settings.token_secrets[0], why)

    def prune(self, batch: int = 1000, most: int = 50) -> tuple[int, int]:
        """Delete rejected messages and unregistered agents past their retention, in small
        transactions (a flood of junk leaves a bounded table, and no long lock); how many of
        each were deleted."""
        settings = self._rt.settings
        now = self._rt.clock()
        rejections = timedelta(days=settings.rejected_retention_days)
        silence = timedelta(days=settings.agent_retention_days)
        pruned = [0, 0]
        for i, (prune, age) in enumerate(
            ((q.prune_rejections_txn, rejections), (agent_store.prune_agents_txn, silence))
        ):
            for _ in range(most):
                with self._rt.db.begin() as conn:
                    deleted = prune(conn, now - age, batch)
                pruned[i] += deleted
                if deleted < batch:
                    break
        return pruned[0], pruned[1]


def _contained(row: q.AnyRow, work: Callable[..., None], *args: Any) -> None:
    """Do one machine's part of a scan; an error of that machine alone (not of the database,
    which fails the whole transaction) is logged and the scan goes on: the machine stays due and
    is tried again by the next scan."""
    try:
        work(*args)
    except sqlalchemy.exc.SQLAlchemyError:
        raise
    except Exception:
        log.exception("the scan could not handle machine %s; it goes on without it", row.id)
