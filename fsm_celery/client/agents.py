"""The client's agents: who reported and what they work on, and their Redis credentials
(registered, revoked, audited)."""

from __future__ import annotations

from dataclasses import fields
from typing import Any
from uuid import UUID

from fsm_celery.client.base import ClientBase, agent_uuid, check_actor, dicts
from fsm_celery.exceptions import AgentNotFound
from fsm_celery.records import AgentInfo, jsonable
from fsm_celery.store import credentials as credential_store

REPORTED = [f.name for f in fields(AgentInfo) if f.name != "working_on"]  # an agent row's


class Agents(ClientBase):
    """List agents; register and revoke their credentials."""

    def agents(self) -> list[dict[str, Any]]:
        """Every agent that ever reported, with its status and when it was last seen."""
        return dicts(self.reader.agents())

    def agents_at_work(self) -> list[AgentInfo]:
        """Every agent with its status, when it was last seen, and what it works on now."""
        listed, work = self.reader.agents_at_work()
        doing: dict[UUID, list[dict[str, Any]]] = {}
        for w in work:
            doing.setdefault(w.agent_id, []).append(jsonable(dict(w._mapping)))
        return [
            AgentInfo(
                **{name: getattr(a, name) for name in REPORTED}, working_on=doing.get(a.id, [])
            )
            for a in listed
        ]

    def register_agent(
        self,
        agent_id: UUID | str,
        agent_type: str,
        acl_rules: list[str] | None = None,
        actor: str = "cli",
    ) -> None:
        """Record that the agent was given credentials for the agent type: a status it sends
        claiming another type is refused; with its Redis user's rules (the password hashed),
        which the bridge creates again on a Redis that lost them (channel.acl.restore_users)."""
        now = self.engine.runtime.clock()
        credential_store.register(
            self.engine.db, agent_uuid(agent_id), agent_type, now, acl_rules, actor
        )

    def revoke_agent(self, agent_id: UUID | str, actor: str, reason: str = "") -> bool:
        """Revoke the agent's Redis credentials, audited: its rules forgotten (the bridge no
        longer creates its user again), no machine assigned to it, its Redis user deleted and
        the connections it opened closed; whether Redis had its user (AgentNotFound when the
        deployment never knew the agent)."""
        check_actor(actor)
        aid = agent_uuid(agent_id)
        if not credential_store.revoke(self.engine.db, aid, actor, reason):
            raise AgentNotFound(str(aid))
        return self._revoke_user(aid) if self._revoke_user is not None else False

    def credential_events(self, agent_id: UUID | str) -> list[dict[str, Any]]:
        """Who issued and who revoked the agent's credentials, when and why, oldest first."""
        return dicts(self.reader.credential_events(agent_uuid(agent_id)))
