"""Agents' Redis credentials in the database: their audit (issued, revoked) and revocation."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from uuid import UUID

from sqlalchemy import Connection, Engine, insert, update

from fsm_celery.store.agents import REVOKED, register_agent_txn
from fsm_celery.store.queries import AnyRow, oldest_first_txn
from fsm_celery.store.tables import agent_credential_events, agents

ISSUED = "issued"


def register(
    db: Engine,
    agent_id: UUID,
    agent_type: str,
    now: datetime,
    acl_rules: list[str] | None,
    actor: str,
) -> None:
    """Record that the agent holds credentials for the type, and, with its Redis user's rules
    (the deployment created the user), audit them as issued: one transaction."""
    with db.begin() as conn:
        register_agent_txn(conn, agent_id, agent_type, now, acl_rules)
        if acl_rules is not None:
            record_txn(conn, agent_id, ISSUED, actor, "")


def revoke(db: Engine, agent_id: UUID, actor: str, reason: str) -> bool:
    """revoke_txn in its own transaction."""
    with db.begin() as conn:
        return revoke_txn(conn, agent_id, actor, reason)


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
    return oldest_first_txn(conn, agent_credential_events.c.agent_id, agent_id)
