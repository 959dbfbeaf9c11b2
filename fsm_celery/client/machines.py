"""The client's machines: start them, command them (pause … force, budgets, in bulk), and
list them, their children, trees and fan-outs."""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from uuid import UUID

from fsm_celery.client.base import ClientBase, check_actor, dicts
from fsm_celery.core.admin import Action, Command
from fsm_celery.core.start_key import Started
from fsm_celery.core.usage import Budget
from fsm_celery.exceptions import FsmError
from fsm_celery.records import BulkResult, FanOutProgress, MachineInfo, TreeNode
from fsm_celery.store.reads import Cursor, MachineFilter

TREE_SHOWN = 10  # children a tree lists of each machine; the others it counts by status
TREE_MOST = 200  # machines a tree lists at most
FAN_OUTS = 20  # a machine's latest fan-outs shown (a loop may enter a fan-out state often)


class Machines(ClientBase):
    """Start, command and list machines."""

    def start_machine(
        self,
        machine_type: str,
        context: Mapping[str, Any] | None = None,
        agent_id: UUID | str | None = None,
        github_issue: int | None = None,
        key: str | None = None,
    ) -> UUID:
        """Start a machine of the type; returns its id once its first state is enqueued.

        With a key (1 to 200 printable characters), a start repeated with it returns the id
        of the machine the first made, whatever its status now, and starts nothing; one that
        asks another type, context, agent or issue raises StartKeyReused. `start` tells which
        of the two happened."""
        return self.start(machine_type, context, agent_id, github_issue, key).machine_id

    def start(
        self,
        machine_type: str,
        context: Mapping[str, Any] | None = None,
        agent_id: UUID | str | None = None,
        github_issue: int | None = None,
        key: str | None = None,
    ) -> Started:
        """start_machine's outcome: the machine's id, and whether the key's machine was found
        (`found`) rather than started now."""
        started = self.engine.admin.start(machine_type, context, agent_id, github_issue, key)
        self._hand_on(started.next)
        return started

    def pause(self, machine_id: UUID | str, actor: str, reason: str = "") -> MachineInfo:
        """Stop dispatching: acks for the running attempt will be refused."""
        return self._command(machine_id, Command(Action.PAUSE, actor, reason))

    def resume(self, machine_id: UUID | str, actor: str, reason: str = "") -> MachineInfo:
        """Enter the paused machine's current state again, as a new attempt."""
        return self._command(machine_id, Command(Action.RESUME, actor, reason))

    def cancel(self, machine_id: UUID | str, actor: str, reason: str = "") -> MachineInfo:
        """End the machine for good; its state stays where it was."""
        return self._command(machine_id, Command(Action.CANCEL, actor, reason))

    def retry(self, machine_id: UUID | str, actor: str, reason: str = "") -> MachineInfo:
        """Enter the current state again now (a failed machine: the state that failed)."""
        return self._command(machine_id, Command(Action.RETRY, actor, reason))

    def force(
        self, machine_id: UUID | str, target: str, actor: str, reason: str = ""
    ) -> MachineInfo:
        """Move the machine to the named state, whatever its status."""
        return self._command(machine_id, Command(Action.FORCE, actor, reason, target))

    def set_budget(
        self,
        machine_id: UUID | str,
        actor: str,
        tokens: int | None = None,
        cost: float | None = None,
        reason: str = "",
    ) -> MachineInfo:
        """Set the machine's budget (None: no limit), audited with who and why; a machine
        paused over budget resumes."""
        check_actor(actor)
        mid = self.full_id(machine_id)
        budget = Budget(tokens=tokens, cost=cost)
        self.enqueue(self.engine.admin.set_budget(mid, budget, actor, reason))
        return self.get_machine(mid)

    def budget_changes(self, machine_id: UUID | str) -> list[dict[str, Any]]:
        """Who changed the machine's budget, when, why, and from what."""
        return dicts(self.reader.budget_changes(machine_id))

    def bulk(
        self, action: Action, where: MachineFilter, actor: str, reason: str = "", limit: int = 100
    ) -> list[BulkResult]:
        """Command every machine the filter selects (newest first, at most limit), each in its
        own transaction: one refused does not stop the others."""
        check_actor(actor)
        results = []
        for mid in self.reader.machine_ids(where, limit):
            try:
                info = self._command(mid, Command(action, actor, reason))
            except FsmError as exc:
                results.append(BulkResult(mid, False, error=str(exc)))
            else:
                results.append(BulkResult(mid, True, status=info.status))
        return results

    def list_machines(
        self,
        *,
        agent_type: str | None = None,
        status: str | None = None,
        machine_type: str | None = None,
        parent: UUID | str | None = None,
        limit: int = 100,
    ) -> list[MachineInfo]:
        """Machines, newest first, filtered by agent type, status, machine type and parent."""
        where = MachineFilter(
            status=status,
            machine_type=machine_type,
            agent_type=agent_type,
            parent_id=self.full_id(parent) if parent is not None else None,
        )
        return self.find_machines(where, limit)

    def find_machines(
        self, where: MachineFilter, limit: int = 50, after: Cursor | None = None
    ) -> list[MachineInfo]:
        """A page of the machines the filter selects, newest first, after the cursor."""
        return [MachineInfo.from_row(r) for r in self.reader.find_machines(where, limit, after)]

    def count_machines(self, where: MachineFilter) -> dict[str, int]:
        """How many machines the filter selects, by status."""
        return self.reader.count_machines(where)

    def children(
        self, machine_id: UUID | str, limit: int = 100, after: Cursor | None = None
    ) -> list[MachineInfo]:
        """A page of the machine's children (of every attempt), newest first, after the
        cursor (MachineNotFound if no such machine)."""
        return [MachineInfo.from_row(r) for r in self.reader.children(machine_id, limit, after)]

    def tree(
        self, machine_id: UUID | str, shown: int = TREE_SHOWN, most: int = TREE_MOST
    ) -> TreeNode:
        """The machine and its descendants, each with its first `shown` children listed and
        the others counted by status; `most` machines in all."""
        return TreeNode.of(self.reader.tree(machine_id, shown, most))

    def fan_outs(self, machine_id: UUID | str, limit: int = FAN_OUTS) -> list[FanOutProgress]:
        """The machine's latest fan-outs, newest first: how many children, and how they stand
        (done, failed, running, waiting, cancelled)."""
        rows, slots = self.reader.fan_outs(machine_id, limit)
        return [FanOutProgress.from_row(r, slots.get(r.attempt, {})) for r in rows]


def encode_cursor(cursor: Cursor) -> str:
    """A page's cursor as the text a door hands out (base64 of its JSON)."""
    created_at, machine_id = cursor
    raw = json.dumps([created_at.isoformat(), str(machine_id)]).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(text: str) -> Cursor:
    """The cursor a page handed out (ValueError when it is not one)."""
    try:
        raw = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
        created_at, machine_id = json.loads(raw)
        return datetime.fromisoformat(created_at), UUID(machine_id)
    except (binascii.Error, ValueError, TypeError) as exc:
        raise ValueError(f"cursor {text[:60]!r} is not one a page gave") from exc
