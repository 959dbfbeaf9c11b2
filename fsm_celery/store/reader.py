"""The store's reads for the front doors (the client, and through it the CLI, the HTTP API and
the dashboard): each method opens its own read transaction over the `*_txn` helpers and hands
back rows. A machine is named by its id or the start of it (at least four hex digits, as git
takes a commit's: the dashboard shows eight)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Concatenate, ParamSpec, TypeVar
from uuid import UUID

from sqlalchemy import Connection, Engine

from fsm_celery.core.messages import INT32_MAX
from fsm_celery.exceptions import AmbiguousMachineId, MachineNotFound
from fsm_celery.store import agents as agent_store
from fsm_celery.store import credentials as credential_store
from fsm_celery.store import gates as gate_store
from fsm_celery.store import notify as notify_store
from fsm_celery.store import queries as q
from fsm_celery.store import reads, start_keys
from fsm_celery.store import signals as signal_store
from fsm_celery.store import slots as slot_store
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.reads import Cursor, MachineFilter, Tree

MIN_PREFIX = 4  # hex digits of an id that may name a machine (git's shortest commit prefix)
CANDIDATES = 10  # ids an ambiguous prefix's error lists at most
Rows = Sequence[AnyRow]
P = ParamSpec("P")
R = TypeVar("R")


class Reader:
    """Reads, each in its own transaction; MachineNotFound for a machine there is not."""

    def __init__(self, db: Engine) -> None:
        self.db = db

    def machine_id(self, value: UUID | str) -> UUID:
        """The id of the machine, given its id or the start of it; MachineNotFound when no
        machine's id starts so, AmbiguousMachineId when more than one does."""
        exact = _exact_id(value)
        if exact is not None:  # a whole id needs no query
            return exact
        with self.db.connect() as conn:
            return _machine_id_txn(conn, value)

    def machine(self, value: UUID | str) -> tuple[AnyRow, int | None, str | None]:
        """The machine's row, its place in its agent type's queue when it waits for a slot, and
        the key it was started with."""
        with self.db.connect() as conn:
            row = q.get_machine_txn(conn, _machine_id_txn(conn, value))
            if row is None:
                raise MachineNotFound(str(value))
            position = None
            if row.queued_at is not None and row.status == "running":
                position = slot_store.queue_position_txn(conn, row)
            key = start_keys.key_of_txn(conn, row.id)
        return row, position, key

    def find_machines(self, where: MachineFilter, limit: int, after: Cursor | None = None) -> Rows:
        """A page of the machines the filter selects, newest first, after the cursor."""
        with self.db.connect() as conn:
            return reads.find_machines_txn(conn, where, limit, after)

    def count_machines(self, where: MachineFilter) -> dict[str, int]:
        """How many machines the filter selects, by status (the counters and their changes
        read in one snapshot, when the filter lets the counters answer)."""
        with self.db.connect() as conn:
            if conn.dialect.name == "postgresql":
                conn.execution_options(isolation_level="REPEATABLE READ")
            with conn.begin():
                return reads.count_machines_txn(conn, where)

    def machine_ids(self, where: MachineFilter, limit: int) -> list[UUID]:
        """The ids of the machines the filter selects, newest first, at most limit."""
        with self.db.connect() as conn:
            return reads.machine_ids_txn(conn, where, limit)

    def children(self, value: UUID | str, limit: int, after: Cursor | None) -> Rows:
        """A page of the machine's children, newest first, after the cursor."""
        with self.db.connect() as conn:
            mid = _machine_id_txn(conn, value)
            rows = reads.find_machines_txn(conn, MachineFilter(parent_id=mid), limit, after)
            return _known(conn, mid, rows, value)

    def tree(self, value: UUID | str, shown: int, most: int) -> Tree:
        """The machine's tree (store.reads.tree_txn)."""
        with self.db.connect() as conn:
            found = reads.tree_txn(conn, _machine_id_txn(conn, value), shown, most)
        if found is None:
            raise MachineNotFound(str(value))
        return found

    def fan_outs(self, value: UUID | str, limit: int) -> tuple[Rows, dict[int, dict[str, int]]]:
        """The machine's latest fan-outs, and each one's slots counted by status."""
        with self.db.connect() as conn:
            mid = _machine_id_txn(conn, value)
            rows = _known(conn, mid, reads.fan_outs_txn(conn, mid, limit), value)
            slots = reads.slot_counts_txn(conn, mid, [r.attempt for r in rows]) if rows else {}
        return rows, slots

    def history(self, value: UUID | str) -> Rows:
        """The machine's history rows in attempt order."""
        with self.db.connect() as conn:
            mid = _machine_id_txn(conn, value)
            return _known(conn, mid, q.history_txn(conn, mid), value)

    def context_deltas(self, value: UUID | str, upto: int | None) -> tuple[UUID, Rows]:
        """The machine's id, and its history's context changes up to a step (all of them)."""
        with self.db.connect() as conn:
            mid = _machine_id_txn(conn, value)
            rows = q.context_deltas_txn(conn, mid, INT32_MAX if upto is None else upto)
            return mid, _known(conn, mid, rows, value)

    def forks(self, value: UUID | str) -> Rows:
        """The machines forked from this one, oldest first."""
        return self._of_machine(q.forks_txn, value)

    def budget_changes(self, value: UUID | str) -> Rows:
        """The machine's budget changes, oldest first."""
        return self._of_machine(q.budget_changes_txn, value)

    def notifications(self, value: UUID | str) -> Rows:
        """The machine's notifications."""
        return self._of_machine(notify_store.of_machine_txn, value)

    def events(self, value: UUID | str) -> Rows:
        """The outside events sent to the machine, oldest first."""
        return self._of_machine(signal_store.machine_events_txn, value)

    def gates(self, value: UUID | str) -> tuple[Rows, Rows]:
        """The machine's approval gates, and the decisions made at them, oldest first."""
        return self._of_machine(_gates_txn, value)

    def rejections(self, value: UUID | str | None, limit: int) -> Rows:
        """The latest rejected messages (of the machine, when one is named), newest first."""
        with self.db.connect() as conn:
            mid = _machine_id_txn(conn, value) if value is not None else None
            return q.rejections_txn(conn, mid, limit)

    def pending_gates(self, limit: int, machine_type: str | None) -> Rows:
        """The approval gates waiting for people, soonest deadline first."""
        return self._read(gate_store.pending_txn, limit, machine_type)

    def agents(self) -> Rows:
        """Every agent that ever reported, by type."""
        return self._read(agent_store.list_agents_txn)

    def agents_at_work(self) -> tuple[Rows, Rows]:
        """Every agent, and the unfinished machines assigned to one."""
        return self._read(reads.agents_at_work_txn)

    def credential_events(self, agent_id: UUID) -> Rows:
        """Who issued and who revoked the agent's credentials, oldest first."""
        return self._read(credential_store.events_txn, agent_id)

    def machine_types(self) -> list[str]:
        """Every machine type with a stored definition."""
        return self._read(reads.machine_types_txn)

    def agent_types(self) -> list[str]:
        """Every agent type a stored definition names."""
        return self._read(reads.agent_types_txn)

    def definition_versions(self) -> Rows:
        """Every stored definition version, without its body."""
        return self._read(reads.definition_versions_txn)

    def definition(self, machine_type: str, version: int | None) -> tuple[AnyRow | None, list[int]]:
        """One stored version's row (the latest when version is None), and every version of
        the type, newest first."""
        with self.db.connect() as conn:
            row = reads.definition_body_txn(conn, machine_type, version)
            return row, reads.versions_of_txn(conn, machine_type)

    def _read(
        self, helper: Callable[Concatenate[Connection, P], R], *args: P.args, **kwargs: P.kwargs
    ) -> R:
        """What the helper reads, in a transaction of its own."""
        with self.db.connect() as conn:
            return helper(conn, *args, **kwargs)

    def _of_machine(self, helper: Callable[[Connection, UUID], R], value: UUID | str) -> R:
        """What the helper reads of the machine named by its id or a prefix of it."""
        with self.db.connect() as conn:
            return helper(conn, _machine_id_txn(conn, value))


def _machine_id_txn(conn: Connection, value: UUID | str) -> UUID:
    """A machine's id from its id or an unambiguous start of it (see Reader.machine_id)."""
    exact = _exact_id(value)
    if exact is not None:
        return exact
    given = str(value)  # a str: a UUID is exact
    text = given.strip()
    if reads.id_range(text) is None:
        raise MachineNotFound(given)
    if len(text.replace("-", "")) < MIN_PREFIX:
        raise MachineNotFound(given, f": give its full id or at least {MIN_PREFIX} hex digits")
    found = reads.machine_ids_starting_txn(conn, text, CANDIDATES + 1)
    if not found:
        raise MachineNotFound(given)
    if len(found) > 1:
        shown = [str(mid) for mid in found[:CANDIDATES]]
        raise AmbiguousMachineId(given, shown, more=len(found) > CANDIDATES)
    return found[0]


def _exact_id(value: UUID | str) -> UUID | None:
    """The value as a whole id, or None (a prefix, or not an id at all)."""
    if isinstance(value, UUID):
        return value
    try:
        return UUID(value.strip())
    except ValueError:
        return None


def _gates_txn(conn: Connection, machine_id: UUID) -> tuple[Rows, Rows]:
    return gate_store.machine_gates_txn(conn, machine_id), gate_store.machine_decisions_txn(
        conn, machine_id
    )


def _known(conn: Connection, machine_id: UUID, rows: Rows, given: UUID | str) -> Rows:
    """The machine's rows; MachineNotFound when there are none because there is no machine."""
    if not rows and q.get_machine_txn(conn, machine_id) is None:
        raise MachineNotFound(str(given))
    return rows
