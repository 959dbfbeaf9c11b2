"""The client's approval gates: people's decisions, the gates waiting for them, and what was
decided at a machine's gates."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from fsm_celery.client.base import ClientBase, dicts, outcome
from fsm_celery.core.gate import Choice, Vote
from fsm_celery.engine.approvals import ADMIN, Authority
from fsm_celery.exceptions import InvalidDecision


class Approvals(ClientBase):
    """Decide at approval gates, and list them."""

    def decide(
        self,
        machine_id: UUID | str,
        decision: str,
        actor: str,
        *,
        fields: Mapping[str, Any] | None = None,
        comment: str = "",
        via: str = "client",
        authority: Authority = ADMIN,
        attempt: int | None = None,
    ) -> dict[str, Any]:
        """Record a person's decision, approve or reject, at the machine's approval gate (with
        the gate's form filled in as `fields`); a verdict moves the machine on. A person's
        second decision at a gate changes nothing (`recorded` false: their first stands)."""
        try:
            choice = Choice(decision)
        except ValueError:
            raise InvalidDecision(
                str(machine_id), f"{decision!r} is not approve or reject"
            ) from None
        mid = self.full_id(machine_id)
        vote = Vote(actor, choice, dict(fields or {}), comment, via)
        decided = self.engine.approvals.decide(mid, vote, authority, attempt)
        self._hand_on(decided.next)
        return outcome(decided)

    def approvals(self, limit: int = 100, machine_type: str | None = None) -> list[dict[str, Any]]:
        """The approval gates waiting for people, soonest deadline first."""
        return dicts(self.reader.pending_gates(limit, machine_type))

    def decisions(self, machine_id: UUID | str) -> dict[str, list[dict[str, Any]]]:
        """The machine's approval gates and the decisions made at them, oldest first."""
        gates, made = self.reader.gates(machine_id)
        return {"gates": dicts(gates), "decisions": dicts(made)}
