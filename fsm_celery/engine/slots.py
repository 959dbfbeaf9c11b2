"""Per agent type, a bound on work in flight across all machines (an LLM provider's rate limit
is per account, not per machine): `agent_types: {researcher: {max_in_flight: 20}}` in a
definition, or FSM_AGENT_TYPE_LIMITS.

A state entry over its type's bound is not dispatched: the machine waits in PostgreSQL,
`queued` since then, with no deadline running. The transaction that ends an attempt of the type
frees its slot and enters the machine queued longest in it, there and then. The type's row in
agent_type_slots is locked by each transaction that takes or frees a slot, so the count never
overshoots; the scan counts again what is in flight, should a count ever drift.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from uuid import UUID

from sqlalchemy import Connection

from fsm_celery.core.transition import MachineStatus
from fsm_celery.engine.runtime import Runtime
from fsm_celery.store import queries as q
from fsm_celery.store import slots as store
from fsm_celery.store.writes import Writes


@dataclass
class Ledger:
    """A transaction's part (Writes.parts): per agent type with a bound, the bound and the count
    in flight (its row locked); the slots taken here, the machines whose slot was freed, the
    transitions looked at so far, and the machines taken out of the queue, left to the scan."""

    bounds: dict[str, int | None] = field(default_factory=dict)
    in_flight: dict[str, int] = field(default_factory=dict)
    taken: dict[UUID, str] = field(default_factory=dict)
    freed: set[UUID] = field(default_factory=set)
    released: int = 0
    unqueued: list[UUID] = field(default_factory=list)

    def write(self, conn: Connection, writes: Writes) -> None:
        store.write_counts_txn(conn, self.in_flight)
        store.make_due_txn(conn, self.unqueued, writes.now)


class Slots:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime
        self.bounds = store.Bounds(runtime.settings.agent_type_limits)  # read now and then

    def take_txn(self, conn: Connection, machine_id: UUID, agent_type: str, writes: Writes) -> bool:
        """Take a slot of the type for the machine's attempt; False when the type is at its
        bound (the machine is then queued). A type without a bound always has one."""
        ledger = ledger_of(writes)
        bound = self._bound(conn, agent_type, writes)
        if bound is None:
            return True
        count = self._count(conn, agent_type, writes)
        if count >= bound:
            return False
        ledger.in_flight[agent_type] = count + 1
        ledger.taken[machine_id] = agent_type
        return True

    def release_txn(self, conn: Connection, writes: Writes) -> dict[str, int]:
        """Free the slots of the attempts the transaction's transitions since the last call
        ended; how many slots each type has free now (to enter queued machines in)."""
        ledger = ledger_of(writes)
        freed: set[str] = set()
        for row, _, _ in writes.log[ledger.released :]:
            agent_type = ledger.taken.pop(row.id, None)
            if (
                agent_type is None
                and row.id not in ledger.freed
                and self._bound(conn, row.agent_type, writes) is not None
                and self._held(conn, row)
            ):
                agent_type = row.agent_type
            ledger.freed.add(row.id)
            if agent_type is not None:
                ledger.in_flight[agent_type] = self._count(conn, agent_type, writes) - 1
                freed.add(agent_type)
        ledger.released = len(writes.log)
        return {t: free for t in sorted(freed) if (free := self._free(conn, t, writes)) > 0}

    def reconcile_txn(self, conn: Connection, writes: Writes) -> dict[str, int]:
        """Count again each bounded type's work in flight (the scan's repair, should a count
        have drifted); how many slots each has free."""
        ledger = ledger_of(writes)
        types = sorted(set(store.bounded_txn(conn)) | set(self._rt.settings.agent_type_limits))
        free: dict[str, int] = {}
        for agent_type in types:
            if self._bound(conn, agent_type, writes) is None:
                continue
            self._count(conn, agent_type, writes)  # locks the row: nothing moves meanwhile
            ledger.in_flight[agent_type] = store.in_flight_txn(conn, agent_type)
            if (left := self._free(conn, agent_type, writes)) > 0:
                free[agent_type] = left
        return free

    def queued_txn(self, conn: Connection, agent_type: str, most: int) -> list[q.AnyRow]:
        return store.queued_txn(conn, agent_type, most)

    def _free(self, conn: Connection, agent_type: str, writes: Writes) -> int:
        bound = self._bound(conn, agent_type, writes)
        return 0 if bound is None else bound - self._count(conn, agent_type, writes)

    def _held(self, conn: Connection, row: q.AnyRow) -> bool:
        """Whether the row, as locked, had an attempt in flight (dispatched to an agent)."""
        if (
            row.status != MachineStatus.RUNNING.value
            or row.dispatch_due_at is not None
            or row.queued_at is not None
            or row.deadline_at is None
        ):
            return False
        definition = self._rt.catalog.version(conn, row.type, row.definition_version)
        return not definition.state(row.current_state).fans_out

    def _bound(self, conn: Connection, agent_type: str, writes: Writes) -> int | None:
        ledger = ledger_of(writes)
        if agent_type not in ledger.bounds:
            ledger.bounds[agent_type] = self.bounds.of(conn, agent_type)
        return ledger.bounds[agent_type]

    def _count(self, conn: Connection, agent_type: str, writes: Writes) -> int:
        ledger = ledger_of(writes)
        if agent_type not in ledger.in_flight:
            ledger.in_flight[agent_type] = store.lock_txn(conn, agent_type)
        return ledger.in_flight[agent_type]


def ledger_of(writes: Writes) -> Ledger:
    """The transaction's Ledger (made now, the first time): its part of Writes.parts."""
    found = writes.parts.get(Ledger)
    if found is None:
        found = writes.parts[Ledger] = Ledger()
    return found
