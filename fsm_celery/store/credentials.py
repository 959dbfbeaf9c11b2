"""Agents' Redis credentials in the database: their audit (issued, revoked) and revocation."""

from __future__ import annotations

from collections.abc import Sequence
from uuid import UUID

from sqlalchemy import Connection, insert, select, update

from fsm_celery.store.agents import REVOKED
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.tables import agent_credential_events, agents

ISSUED = "issued"


def record_txn(conn: Connection, agent_id: UUID, action: str, actor: str, reason: str) -> None:
    """Audit one change to the agent's credentials."""
    conn.execute(
        insert(agent_credential_events).values(
            agent_id=agent_id, action=action, actor=actor, reason=reason
        )
    )


def revoke_txn(conn: Connection, agent_id: UUID, actor: str, reason: str) -> bool:
    """Forget the agent's Redis user's rules (the bridge no longer creates it again) and mark
    it revoked (no machine is assigned to it), audited; whether the agent was known."""
    found = conn.execute(
        update(agents)
        .where(agents.c.id == agent_id)
        .values(acl_rules=None, status=REVOKED)
        .returning(agents.c.id)
    ).first()
    if found is None:
        return False
    record_txn(conn, agent_id, REVOKED, actor, reason)
    return True


def events_txn(conn: Connection, agent_id: UUID) -> Sequence[AnyRow]:
    """The agent's credential changes, oldest first."""
    return conn.execute(
        select(agent_credential_events)
        .where(agent_credential_events.c.agent_id == agent_id)
        .order_by(agent_credential_events.c.id)
    ).all()
