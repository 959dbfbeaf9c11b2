"""The client's outside events: those sent to a machine, and GitHub's webhook deliveries."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any
from uuid import UUID

from fsm_celery.client.base import ClientBase, dicts, outcome
from fsm_celery.core import github
from fsm_celery.core.messages import unstorable
from fsm_celery.engine.github import Delivered

OUTSIDE_EVENTS = ("pull_request", "check_suite", "workflow_run")  # core.github.outside_event


class Events(ClientBase):
    """Send machines outside events, and carry out GitHub's deliveries."""

    def send_event(
        self,
        machine_id: UUID | str,
        name: str,
        payload: Mapping[str, Any] | None = None,
        sender: str = "client",
        *,
        via: str = "client",
        key: str | None = None,
    ) -> dict[str, Any]:
        """Send the machine an outside event: applied at once when it waits for it, else kept
        until it enters the state that does (`outcome`: applied, kept, or duplicate, when
        `key` was sent before)."""
        mid = self.full_id(machine_id)
        done = self.engine.signals.send(mid, name, dict(payload or {}), sender, via, key)
        self._hand_on(done.next)
        return outcome(done)

    def events(self, machine_id: UUID | str) -> list[dict[str, Any]]:
        """The outside events sent to the machine, oldest first: kept, applied or refused."""
        return dicts(self.reader.events(machine_id))

    def github_delivery(self, delivery: str, event: str, payload: Any) -> Delivered:
        """Carry out a GitHub webhook delivery (its signature already checked): start the
        machine an issue asks for, or decide at its gate as an approver's comment says; once
        however often the delivery comes."""
        settings = self.engine.settings
        action = payload.get("action") if isinstance(payload, dict) else None
        if not isinstance(action, str) or unstorable(action) is not None:
            action = None
        if event == "issue_comment":  # an approver's /approve or /reject
            decision = github.comment_decision(event, payload)
            done = self.engine.github.comment(delivery, event, decision, action)
        elif event in OUTSIDE_EVENTS:  # an event for machines waiting for it
            outside = github.outside_event(event, payload, fork_heads=settings.github_fork_heads)
            signals = self.engine.signals
            done = self.engine.github.outside(delivery, event, outside, action, signals)
        else:
            wanted = github.decide(
                event,
                payload,
                build_type=settings.github_build_type,
                bug_type=settings.github_bug_type,
                bug_label=settings.github_bug_label,
            )
            done = self.engine.github.deliver(delivery, event, wanted, action)
        if done.next:
            self._hand_on(done.next)
        return done
