"""What the HTTP API and the dashboard read: machines filtered and paged, agents with what
they work on now, definitions' versions, fan-outs' children and progress. Each helper takes a
connection and never commits, and each is bounded: a map of 10,000 items never makes a page
of 10,000 rows."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection, Select, func, select, tuple_

from fsm_celery.core.join import SlotStatus
from fsm_celery.store import rollup
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.tables import agents, definitions, fan_out_items, fan_outs, machines

UNFINISHED = ("running", "paused")


@dataclass(frozen=True)
class MachineFilter:
    """Which machines: every field given must match (created_* bound created_at; roots: only
    machines no fan-out started)."""

    status: str | None = None
    machine_type: str | None = None
    agent_type: str | None = None
    agent_id: UUID | None = None
    github_issue: int | None = None
    parent_id: UUID | None = None
    created_after: datetime | None = None
    created_before: datetime | None = None
    roots: bool = False

    def apply(self, query: Select[tuple[object, ...]]) -> Select[tuple[object, ...]]:
        c = machines.c
        for column, value in (
            (c.status, self.status),
            (c.type, self.machine_type),
            (c.agent_type, self.agent_type),
            (c.agent_id, self.agent_id),
            (c.github_issue, self.github_issue),
            (c.parent_id, self.parent_id),
        ):
            if value is not None:
                query = query.where(column == value)
        if self.roots:
            query = query.where(c.parent_id.is_(None))
        if self.created_after is not None:
            query = query.where(c.created_at >= self.created_after)
        if self.created_before is not None:
            query = query.where(c.created_at < self.created_before)
        return query


Cursor = tuple[datetime, UUID]  # the last machine of a page: (created_at, id)


def find_machines_txn(
    conn: Connection, where: MachineFilter, limit: int, after: Cursor | None = None
) -> Sequence[AnyRow]:
    """A page of machines, newest first, after the cursor (keyset: no OFFSET to walk)."""
    query = where.apply(select(machines))
    if after is not None:
        query = query.where(tuple_(machines.c.created_at, machines.c.id) < tuple_(*after))
    order = (machines.c.created_at.desc(), machines.c.id.desc())
    return conn.execute(query.order_by(*order).limit(limit)).all()


def machine_ids_txn(conn: Connection, where: MachineFilter, limit: int) -> list[UUID]:
    """The ids of the machines the filter selects, newest first, at most limit."""
    query = where.apply(select(machines.c.id))
    order = (machines.c.created_at.desc(), machines.c.id.desc())
    return [row.id for row in conn.execute(query.order_by(*order).limit(limit))]


def count_machines_txn(conn: Connection, where: MachineFilter) -> dict[str, int]:
    """How many machines the filter selects, by status (statuses without one left out). A
    filter of status, type and agent type alone is answered by the counters the statistics
    keep (store.rollup): the same count, without reading a million waiting machines (read in
    one snapshot: REPEATABLE READ on PostgreSQL, as the reader's count_machines asks)."""
    if where == MachineFilter(where.status, where.machine_type, where.agent_type):
        found: dict[str, int] = {}
        for n in rollup.machine_counts_txn(conn):
            if all(
                wanted is None or wanted == got
                for wanted, got in (
                    (where.status, n.status),
                    (where.machine_type, n.type),
                    (where.agent_type, n.agent_type),
                )
            ):
                found[n.status] = found.get(n.status, 0) + n.total
        return found
    query = where.apply(select(machines.c.status, func.count().label("n")))
    return {row.status: row.n for row in conn.execute(query.group_by(machines.c.status))}


def agents_at_work_txn(conn: Connection) -> tuple[Sequence[AnyRow], Sequence[AnyRow]]:
    """Every agent, and the unfinished machines assigned to one (what it works on now)."""
    listed = conn.execute(
        select(agents).order_by(agents.c.agent_type, agents.c.last_seen_at.desc())
    ).all()
    work = conn.execute(
        select(
            machines.c.id,
            machines.c.type,
            machines.c.agent_id,
            machines.c.current_state,
            machines.c.status,
            machines.c.attempt,
            machines.c.entered_at,
            machines.c.progress,
        )
        .where(machines.c.agent_id.is_not(None), machines.c.status.in_(UNFINISHED))
        .order_by(machines.c.updated_at.desc())
    ).all()
    return listed, work


def definition_versions_txn(conn: Connection) -> Sequence[AnyRow]:
    """Every stored definition version (without its body), by type then newest first."""
    return conn.execute(
        select(
            definitions.c.type,
            definitions.c.version,
            definitions.c.agent_type,
            definitions.c.description,
            definitions.c.initial_state,
            definitions.c.created_at,
            func.count(machines.c.id).label("machines"),
        )
        .select_from(
            definitions.outerjoin(
                machines,
                (machines.c.type == definitions.c.type)
                & (machines.c.definition_version == definitions.c.version),
            )
        )
        .group_by(definitions.c.id)
        .order_by(definitions.c.type, definitions.c.version.desc())
    ).all()


def versions_of_txn(conn: Connection, machine_type: str) -> list[int]:
    """The type's stored versions, newest first."""
    query = (
        select(definitions.c.version)
        .where(definitions.c.type == machine_type)
        .order_by(definitions.c.version.desc())
    )
    return [row.version for row in conn.execute(query)]


def machine_types_txn(conn: Connection) -> list[str]:
    """Every machine type with a stored definition, by name."""
    query = select(definitions.c.type).distinct().order_by(definitions.c.type)
    return [row.type for row in conn.execute(query)]


def agent_types_txn(conn: Connection) -> list[str]:
    """Every agent type a stored definition names, by name."""
    query = select(definitions.c.agent_type).distinct().order_by(definitions.c.agent_type)
    return [row.agent_type for row in conn.execute(query)]


def id_range(prefix: str) -> tuple[UUID, UUID] | None:
    """The lowest and highest ids that start with the prefix (hex digits, dashes ignored), or
    None when it is not one."""
    digits = prefix.replace("-", "").lower()
    if not 0 < len(digits) <= 32 or digits.strip("0123456789abcdef"):
        return None
    pad = 32 - len(digits)
    return UUID(digits + "0" * pad), UUID(digits + "f" * pad)


def machine_ids_starting_txn(conn: Connection, prefix: str, limit: int) -> list[UUID]:
    """The ids (in order, at most limit) that start with the prefix: a range on the primary
    key, which its index serves in PostgreSQL and SQLite alike (`id::text LIKE` would scan)."""
    bounds = id_range(prefix)
    if bounds is None:
        return []
    query = select(machines.c.id).where(machines.c.id.between(*bounds))
    return [row.id for row in conn.execute(query.order_by(machines.c.id).limit(limit))]


def definition_body_txn(conn: Connection, machine_type: str, version: int | None) -> AnyRow | None:
    """One version's stored row (the latest when version is None), or None."""
    query = select(definitions).where(definitions.c.type == machine_type)
    if version is not None:
        query = query.where(definitions.c.version == version)
    return conn.execute(query.order_by(definitions.c.version.desc()).limit(1)).first()


# What a tree shows of a machine: enough to draw a node, never its context.
NODE_COLUMNS = (
    machines.c.id,
    machines.c.type,
    machines.c.parent_id,
    machines.c.branch,
    machines.c.depth,
    machines.c.current_state,
    machines.c.status,
    machines.c.attempt,
    machines.c.error,
)


def tree_node_txn(conn: Connection, machine_id: UUID) -> AnyRow | None:
    """One machine's tree node columns, or None."""
    return conn.execute(select(*NODE_COLUMNS).where(machines.c.id == machine_id)).first()


def first_children_txn(conn: Connection, parents: Sequence[UUID], shown: int) -> list[AnyRow]:
    """At most `shown` children of each parent (its newest fan-out's first, in slot order), as
    tree nodes: one window over the parents' children, whatever their number."""
    c = machines.c
    rank = func.row_number().over(
        partition_by=c.parent_id, order_by=(c.parent_attempt.desc(), c.slot, c.id)
    )
    ranked = select(*NODE_COLUMNS, rank.label("rank")).where(c.parent_id.in_(parents)).subquery()
    query = select(*(ranked.c[col.name] for col in NODE_COLUMNS)).where(ranked.c.rank <= shown)
    return list(conn.execute(query.order_by(ranked.c.parent_id, ranked.c.rank)).all())


def children_by_status_txn(conn: Connection, parents: Sequence[UUID]) -> dict[UUID, dict[str, int]]:
    """How many children each parent has, by status; a map's items not started yet count as
    `waiting` (they are slots, not machines, until their turn)."""
    c = machines.c
    counts: dict[UUID, dict[str, int]] = {}
    rows = conn.execute(
        select(c.parent_id, c.status, func.count().label("n"))
        .where(c.parent_id.in_(parents))
        .group_by(c.parent_id, c.status)
    )
    for row in rows:
        counts.setdefault(row.parent_id, {})[row.status] = row.n
    i = fan_out_items.c
    waiting = conn.execute(
        select(i.parent_id, func.count().label("n"))
        .where(i.parent_id.in_(parents), i.status == SlotStatus.WAITING.value)
        .group_by(i.parent_id)
    )
    for row in waiting:
        counts.setdefault(row.parent_id, {})[SlotStatus.WAITING.value] = row.n
    return counts


@dataclass(frozen=True)
class Tree:
    """A machine and its descendants as read: each parent's first children, and every
    parent's children counted by status (the ones not read are told from these)."""

    root: AnyRow
    children: dict[UUID, list[AnyRow]]
    counts: dict[UUID, dict[str, int]]


def tree_txn(conn: Connection, machine_id: UUID, shown: int, most: int) -> Tree | None:
    """The machine's tree, level by level through parent_id: at most `shown` children of each
    machine and `most` machines in all (None when there is no such machine)."""
    root = tree_node_txn(conn, machine_id)
    if root is None:
        return None
    children: dict[UUID, list[AnyRow]] = {}
    counts: dict[UUID, dict[str, int]] = {}
    level, read = [machine_id], 1
    while level:
        found = children_by_status_txn(conn, level)
        counts |= found
        parents = [p for p in level if set(found.get(p, ())) - {SlotStatus.WAITING.value}]
        room = most - read
        listed = first_children_txn(conn, parents, shown)[:room] if parents and room > 0 else []
        for row in listed:
            children.setdefault(row.parent_id, []).append(row)
        read += len(listed)
        level = [row.id for row in listed]
    return Tree(root, children, counts)


def fan_outs_txn(conn: Connection, parent_id: UUID, limit: int) -> list[AnyRow]:
    """The machine's latest fan-outs (one per attempt of a fan-out state), newest first."""
    counts = [column for column in fan_outs.c if column.name != "shared"]  # not its input
    query = select(*counts).where(fan_outs.c.parent_id == parent_id)
    return list(conn.execute(query.order_by(fan_outs.c.attempt.desc()).limit(limit)).all())


def slot_counts_txn(
    conn: Connection, parent_id: UUID, attempts: Sequence[int]
) -> dict[int, dict[str, int]]:
    """Each of those fan-outs' slots counted by status (waiting, running, succeeded, ...)."""
    i = fan_out_items.c
    rows = conn.execute(
        select(i.attempt, i.status, func.count().label("n"))
        .where(i.parent_id == parent_id, i.attempt.in_(list(attempts)))
        .group_by(i.attempt, i.status)
    )
    counts: dict[int, dict[str, int]] = {}
    for row in rows:
        counts.setdefault(row.attempt, {})[row.status] = row.n
    return counts
