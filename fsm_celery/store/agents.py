"""The engine's SQL on agents: what they report, the credentials the deployment registered
for them, and whom work is handed to. Helpers take a connection and never commit."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import NamedTuple
from uuid import UUID

from sqlalchemy import Connection, case, delete, func, or_, select, update

from fsm_celery.store import dialects
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.rows import AgentReport, values
from fsm_celery.store.tables import agents

REVOKED = "revoked"  # an agent's status once its credentials were revoked


def upsert_agents_txn(conn: Connection, reports: Sequence[AgentReport]) -> None:
    """Record each agent's latest status (insert the first time it is seen), the rows in id
    order: batches of several bridges that report the same agents lock them in one order."""
    if not reports:
        return
    reports = sorted(reports, key=lambda report: report.id)
    statement = dialects.of(conn).insert(agents)
    changed = ("agent_type", "status", "concurrency", "running", "hostname", "last_seen_at")
    statement = statement.on_conflict_do_update(
        index_elements=[agents.c.id],
        set_={name: statement.excluded[name] for name in changed},
    )
    conn.execute(statement, [values(r) for r in reports])


def prune_agents_txn(conn: Connection, before: datetime, limit: int) -> int:
    """Delete up to limit agents not seen since `before` and not registered; how many were."""
    dead = (
        select(agents.c.id)
        .where(agents.c.last_seen_at < before, agents.c.registered_type.is_(None))
        .limit(limit)
    )
    doomed = [row.id for row in conn.execute(dead)]
    if doomed:
        conn.execute(delete(agents).where(agents.c.id.in_(doomed)))
    return len(doomed)


def type_of_agents_txn(conn: Connection, ids: Sequence[UUID]) -> dict[UUID, str]:
    """The type each agent serves: the one it was registered with, else the one it reported."""
    rows = conn.execute(
        select(agents.c.id, func.coalesce(agents.c.registered_type, agents.c.agent_type)).where(
            agents.c.id.in_(ids)
        )
    ).all()
    return {row[0]: row[1] for row in rows}


class Registration(NamedTuple):
    """What the deployment says of an agent's credentials."""

    agent_type: str | None  # the type they were issued for
    revoked: bool  # `fsm-celery agents revoke`: nothing it sends counts any more


def registrations_txn(conn: Connection, ids: Sequence[UUID]) -> dict[UUID, Registration]:
    """The agents' registrations (agents never registered nor revoked are left out)."""
    if not ids:
        return {}
    rows = conn.execute(
        select(agents.c.id, agents.c.registered_type, agents.c.status).where(
            agents.c.id.in_(ids),
            or_(agents.c.registered_type.is_not(None), agents.c.status == REVOKED),
        )
    ).all()
    return {row[0]: Registration(row[1], row[2] == REVOKED) for row in rows}


def register_agent_txn(
    conn: Connection,
    agent_id: UUID,
    agent_type: str,
    now: datetime,
    acl_rules: list[str] | None = None,
) -> None:
    """Record that the agent holds credentials to serve the type (it is not live until it
    reports), and its Redis user's rules when the deployment created it."""
    statement = (
        dialects.of(conn)
        .insert(agents)
        .values(
            id=agent_id,
            agent_type=agent_type,
            registered_type=agent_type,
            status="stopped",
            concurrency=1,
            running=0,
            started_at=now,
            last_seen_at=now,
            acl_rules=acl_rules,
        )
    )
    conn.execute(
        statement.on_conflict_do_update(
            index_elements=[agents.c.id],
            set_={
                "registered_type": agent_type,
                "agent_type": agent_type,
                "acl_rules": acl_rules,
                # new credentials after a revocation: its reports count again
                "status": case((agents.c.status == REVOKED, "stopped"), else_=agents.c.status),
            },
        )
    )


def acl_users_txn(conn: Connection) -> dict[UUID, list[str]]:
    """The Redis ACL rules of the agents whose users the deployment created."""
    rows = conn.execute(
        select(agents.c.id, agents.c.acl_rules).where(agents.c.acl_rules.is_not(None))
    )
    return {row.id: list(row.acl_rules) for row in rows}


def agent_alive_txn(conn: Connection, agent_id: UUID, since: datetime) -> bool:
    """Whether the agent said it is active at or after `since`."""
    found = conn.execute(
        select(agents.c.id).where(
            agents.c.id == agent_id, agents.c.status == "active", agents.c.last_seen_at >= since
        )
    ).first()
    return found is not None


def live_agents_txn(conn: Connection, agent_type: str, since: datetime) -> list[UUID]:
    """The type's live agents, the one assigned least recently first (read without a lock: two
    transactions may hand work to the same agent, which only makes the rotation approximate)."""
    return list(
        conn.execute(
            select(agents.c.id)
            .where(
                agents.c.agent_type == agent_type,
                agents.c.status == "active",
                agents.c.last_seen_at >= since,
            )
            .order_by(agents.c.assigned_at.asc().nulls_first(), agents.c.id)
        ).scalars()
    )


def mark_assigned_txn(conn: Connection, ids: Sequence[UUID], now: datetime) -> None:
    """Record that the agents were handed work now (the next pick starts with the others)."""
    if ids:
        conn.execute(update(agents).where(agents.c.id.in_(list(ids))).values(assigned_at=now))


def list_agents_txn(conn: Connection) -> Sequence[AnyRow]:
    return conn.execute(select(agents).order_by(agents.c.agent_type, agents.c.started_at)).all()


def alive_agents_by_type_txn(conn: Connection, since: datetime) -> dict[str, int]:
    """How many agents of each type said they are active at or after `since`."""
    rows = conn.execute(
        select(agents.c.agent_type, func.count())
        .where(agents.c.status == "active", agents.c.last_seen_at >= since)
        .group_by(agents.c.agent_type)
    ).all()
    return {agent_type: int(count) for agent_type, count in rows}
