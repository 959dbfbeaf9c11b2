"""The MCP door for operators: the tools an assistant gets to watch and steer machines, built
for one identity (a token of the settings: client/identities.py). A viewer's server lists the
read tools only; an approver's adds approve and reject (at the gates their groups decide); an
admin's, every tool. Who acts is the identity, never an argument: what a tool changes is
recorded under its name, `via` "mcp". Every tool is one call of the Python client."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, TypeVar
from uuid import UUID

from mcp.server import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp_types import ToolAnnotations

from fsm_celery.client import TREE_MOST, TREE_SHOWN, Client
from fsm_celery.client.identities import Known, Role
from fsm_celery.client.machines import decode_cursor, encode_cursor
from fsm_celery.core.admin import Action
from fsm_celery.core.loader import load_text
from fsm_celery.core.transition import MachineStatus
from fsm_celery.engine.approvals import Authority
from fsm_celery.exceptions import FsmError
from fsm_celery.mcp.arguments import (
    After,
    AgentType,
    Cost,
    Cursor,
    DefinitionText,
    EventKey,
    EventName,
    Issue,
    JsonObject,
    Limit,
    MachineId,
    MachineType,
    Reason,
    StartKey,
    StateName,
    Step,
    Tokens,
    TypeFilter,
    Version,
)
from fsm_celery.records import MachineInfo, definition_view, jsonable
from fsm_celery.store.reads import MachineFilter

F = TypeVar("F", bound=Callable[..., Any])
VIA = "mcp"
READ = ToolAnnotations(read_only_hint=True, open_world_hint=False)
ACT = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
END = ToolAnnotations(read_only_hint=False, destructive_hint=True, open_world_hint=False)


def refusing(tool: F) -> F:
    """The client's refusals (an unknown machine, a closed gate, a context its schema refuses)
    as the tool's error, its message naming what was wrong."""

    @functools.wraps(tool)
    def call(*args: Any, **kwargs: Any) -> Any:
        try:
            return tool(*args, **kwargs)
        except (FsmError, ValueError) as exc:
            raise ToolError(str(exc)) from exc

    return call  # type: ignore[return-value]


def tool_names(identity: Known) -> list[str]:
    """The names of the tools the identity's server lists."""
    return [name for name, _, _ in _Tools(None, identity).allowed()]


def operator_server(client: Client, identity: Known) -> MCPServer:
    """The operator door's MCP server for one identity."""
    server = MCPServer(
        "fsm-celery operator",
        instructions="Watch and steer fsm-celery machines: list, status, history, tree; "
        "start, pause, resume, cancel; decide at approval gates; send events; rewind, fork, "
        f"replay. You act as {identity.actor!r}.",
        log_level="WARNING",
    )
    for name, fn, hints in _Tools(client, identity).allowed():
        server.add_tool(refusing(fn), name=name, annotations=hints, structured_output=True)
    return server


class _Tools:
    """The tools, bound to a client and an identity."""

    def __init__(self, client: Any, identity: Known) -> None:
        self.client: Client = client
        self.identity = identity

    def allowed(self) -> list[tuple[str, Callable[..., Any], ToolAnnotations]]:
        tools = [(fn.__name__, fn, READ) for fn in self.reads()]
        if self.identity.role is Role.ADMIN or self.identity.groups:
            tools += [(fn.__name__, fn, ACT) for fn in (self.approve, self.reject)]
        if self.identity.role is Role.ADMIN:
            tools += [(fn.__name__, fn, hints) for fn, hints in self.acts()]
        return tools

    def reads(self) -> list[Callable[..., Any]]:
        return [
            self.list_machines,
            self.count_machines,
            self.machine_status,
            self.machine_history,
            self.machine_context,
            self.machine_tree,
            self.machine_children,
            self.machine_decisions,
            self.machine_events,
            self.pending_approvals,
            self.list_definitions,
            self.describe_definition,
            self.replay_machine,
            self.replay_definition,
            self.stats,
            self.rejected_messages,
        ]

    def acts(self) -> list[tuple[Callable[..., Any], ToolAnnotations]]:
        return [
            (self.start_machine, ACT),
            (self.pause_machine, ACT),
            (self.resume_machine, ACT),
            (self.retry_machine, ACT),
            (self.cancel_machine, END),
            (self.force_state, END),
            (self.send_event, ACT),
            (self.rewind_machine, END),
            (self.fork_machine, ACT),
            (self.set_budget, ACT),
        ]

    # reads

    def list_machines(
        self,
        status: MachineStatus | None = None,
        type: TypeFilter = None,
        agent_type: AgentType = None,
        parent: MachineId | None = None,
        roots: bool = False,
        limit: Limit = 50,
        cursor: Cursor = None,
    ) -> dict[str, Any]:
        """Machines, newest first, filtered by status, type, agent type, parent (its
        children) or roots only; a page at a time (pass the answer's `next` as `cursor`)."""
        where = self._filter(status, type, agent_type, parent, roots)
        after = decode_cursor(cursor) if cursor else None
        found = self.client.find_machines(where, limit + 1, after)
        return _page(found, limit)

    def count_machines(
        self,
        status: MachineStatus | None = None,
        type: TypeFilter = None,
        agent_type: AgentType = None,
        roots: bool = False,
    ) -> dict[str, Any]:
        """How many machines the filters select, by status."""
        by_status = self.client.count_machines(self._filter(status, type, agent_type, None, roots))
        return {"total": sum(by_status.values()), "by_status": by_status}

    def machine_status(self, machine_id: MachineId) -> dict[str, Any]:
        """One machine: status, state, context, usage and budget, its fan-outs and forks."""
        return {
            "machine": self.client.get_machine(machine_id).to_dict(),
            "fan_outs": [f.to_dict() for f in self.client.fan_outs(machine_id)],
            "forks": [f.to_dict() for f in self.client.forks(machine_id)],
        }

    def machine_history(
        self, machine_id: MachineId, context: bool = False, after: After = -1, limit: Limit = 100
    ) -> dict[str, Any]:
        """A machine's steps, oldest first, those after step `after`; with `context`, what
        each changed and the context after it. `next` is the `after` of the next page."""
        found = self.client.history(machine_id, context=context, after=after, limit=limit + 1)
        shown = found[:limit]
        more = len(found) > limit
        return {
            "items": [h.to_dict() for h in shown],
            "next": shown[-1].attempt if more else None,
        }

    def machine_context(self, machine_id: MachineId, step: Step | None = None) -> dict[str, Any]:
        """A machine's context as it was after a step (its latest without one)."""
        return self.client.context_at(machine_id, step)

    def machine_tree(self, machine_id: MachineId) -> dict[str, Any]:
        """A machine and the children its fan-outs started, and theirs: each with its first
        children listed and the others counted by status."""
        return {"tree": self.client.tree(machine_id, TREE_SHOWN, TREE_MOST).to_dict()}

    def machine_children(
        self, machine_id: MachineId, limit: Limit = 50, cursor: Cursor = None
    ) -> dict[str, Any]:
        """The machines a machine's fan-out states started, newest first; a page at a time."""
        after = decode_cursor(cursor) if cursor else None
        return _page(self.client.children(machine_id, limit + 1, after), limit)

    def machine_decisions(self, machine_id: MachineId) -> dict[str, Any]:
        """A machine's approval gates and the decisions made at them, oldest first."""
        return self.client.decisions(machine_id)

    def machine_events(self, machine_id: MachineId) -> dict[str, Any]:
        """The outside events sent to a machine: kept, applied or refused."""
        return {"items": self.client.events(machine_id)}

    def pending_approvals(self, type: TypeFilter = None, limit: Limit = 100) -> dict[str, Any]:
        """The approval gates waiting for people, soonest deadline first."""
        return {"items": self.client.approvals(limit, type)}

    def list_definitions(self) -> dict[str, Any]:
        """Every stored version of every machine type, newest first per type."""
        return {"items": self.client.definition_versions()}

    def describe_definition(self, type: MachineType, version: Version = None) -> dict[str, Any]:
        """One version of a machine type (the latest without one): its states and edges,
        context_schema, and what the checker finds in it."""
        found = self.client.definition(type, version)
        return {
            "type": found.type,
            "version": found.version,
            "versions": found.versions,
            "valid": not found.problems,
            "problems": found.problems,
            "definition": definition_view(found.definition.to_json(), admin=self._admin),
        }

    def replay_machine(
        self, machine_id: MachineId, version: Version = None, definition: DefinitionText = None
    ) -> dict[str, Any]:
        """Run a machine's recorded history again against a definition (its YAML given, or a
        stored version of its type, the newest by default), calling no agent and changing
        nothing: whether it takes the same path, where and why it diverges."""
        if definition is not None and version is not None:
            raise ValueError("give a definition or a version, not both")
        given = load_text(definition, "the definition given") if definition else None
        return self.client.replay(machine_id, definition=given, version=version).to_dict()

    def replay_definition(self, definition: DefinitionText, count: Limit = 10) -> dict[str, Any]:
        """Replay the last `count` ended machines of a definition's type against it (its YAML),
        changing nothing: what a new version would do to real runs before it is loaded."""
        if definition is None:
            raise ValueError("definition: a definition's YAML is needed")
        found = load_text(definition, "the definition given")
        return {"items": [r.to_dict() for r in self.client.replay_last(found, count)]}

    def stats(self) -> dict[str, Any]:
        """Machines by status and type, attempts per state, completion rates, usage."""
        return jsonable(self.client.stats())

    def rejected_messages(
        self, machine_id: MachineId | None = None, limit: Limit = 100
    ) -> dict[str, Any]:
        """The latest messages from agents the engine refused, newest first, and why."""
        return {"items": self.client.rejected(machine_id, limit)}

    # deciding at gates

    def approve(
        self,
        machine_id: MachineId,
        fields: JsonObject | None = None,
        comment: Reason = "",
        attempt: Step | None = None,
    ) -> dict[str, Any]:
        """Approve at a machine's approval gate, as yourself (with the gate's form filled in
        as `fields`; `attempt`: the visit of the gate you mean)."""
        return self._decide(machine_id, "approve", fields, comment, attempt)

    def reject(
        self,
        machine_id: MachineId,
        fields: JsonObject | None = None,
        comment: Reason = "",
        attempt: Step | None = None,
    ) -> dict[str, Any]:
        """Reject at a machine's approval gate, as yourself."""
        return self._decide(machine_id, "reject", fields, comment, attempt)

    # acting (an admin's)

    def start_machine(
        self,
        type: MachineType,
        context: JsonObject | None = None,
        agent_id: UUID | None = None,
        github_issue: Issue = None,
        key: StartKey = None,
    ) -> dict[str, Any]:
        """Start a machine of a type with its context (checked against the type's
        context_schema: a refusal names what is wrong, and nothing is started). With a key, a
        start repeated with it answers the machine the first made (`found`: true) and starts
        nothing; one asking another type or context is refused."""
        started = self.client.start(type, context or {}, agent_id, github_issue, key)
        machine = self.client.get_machine(started.machine_id).to_dict()
        return {"machine": machine, "found": started.found}

    def pause_machine(self, machine_id: MachineId, reason: Reason = "") -> dict[str, Any]:
        """Pause a machine: nothing more is dispatched; the running attempt's answer is
        refused."""
        return self._command(Action.PAUSE, machine_id, reason)

    def resume_machine(self, machine_id: MachineId, reason: Reason = "") -> dict[str, Any]:
        """Resume a paused machine: its state is entered again, as a new attempt."""
        return self._command(Action.RESUME, machine_id, reason)

    def retry_machine(self, machine_id: MachineId, reason: Reason = "") -> dict[str, Any]:
        """Enter a machine's current state again now (a failed one: the state that failed)."""
        return self._command(Action.RETRY, machine_id, reason)

    def cancel_machine(self, machine_id: MachineId, reason: Reason = "") -> dict[str, Any]:
        """End a machine for good (its state stays where it was)."""
        return self._command(Action.CANCEL, machine_id, reason)

    def force_state(
        self, machine_id: MachineId, state: StateName, reason: Reason = ""
    ) -> dict[str, Any]:
        """Move a machine to the named state, whatever its status."""
        info = self.client.force(machine_id, state, self.identity.actor, reason)
        return {"machine": info.to_dict()}

    def send_event(
        self,
        machine_id: MachineId,
        name: EventName,
        payload: JsonObject | None = None,
        key: EventKey = None,
    ) -> dict[str, Any]:
        """Send a machine an outside event: applied at once when it waits for it, else kept
        until it enters the state that does."""
        done = self.client.send_event(
            machine_id, name, payload or {}, self.identity.actor, via=VIA, key=key
        )
        return {"event": done}

    def rewind_machine(
        self, machine_id: MachineId, step: Step, set: JsonObject | None = None, reason: Reason = ""
    ) -> dict[str, Any]:
        """Put a machine back at the state it was in after `step`, with the context it had
        then and `set` over it, as a new attempt (the history before it kept)."""
        done = self.client.rewind(machine_id, step, self.identity.actor, reason, set)
        return {"machine": done.machine.to_dict(), "step": done.step}

    def fork_machine(
        self, machine_id: MachineId, step: Step, set: JsonObject | None = None, reason: Reason = ""
    ) -> dict[str, Any]:
        """Start a new machine from a past step of this one (which is untouched)."""
        forked = self.client.fork(machine_id, step, self.identity.actor, reason, set)
        return {"machine": self.client.get_machine(forked).to_dict()}

    def set_budget(
        self,
        machine_id: MachineId,
        tokens: Tokens = None,
        cost: Cost = None,
        reason: Reason = "",
    ) -> dict[str, Any]:
        """Set a machine's budget of tokens and cost (none: no limit)."""
        info = self.client.set_budget(machine_id, self.identity.actor, tokens, cost, reason)
        return {"machine": info.to_dict()}

    # shared

    @property
    def _admin(self) -> bool:
        return self.identity.role is Role.ADMIN

    def _filter(
        self,
        status: MachineStatus | None,
        machine_type: str | None,
        agent_type: str | None,
        parent: str | None,
        roots: bool,
    ) -> MachineFilter:
        return MachineFilter(
            status=status.value if status else None,
            machine_type=machine_type or None,
            agent_type=agent_type or None,
            parent_id=self.client.full_id(parent) if parent else None,
            roots=roots,
        )

    def _command(self, action: Action, machine_id: str, reason: str) -> dict[str, Any]:
        act = getattr(self.client, action.value)
        return {"machine": act(machine_id, self.identity.actor, reason).to_dict()}

    def _decide(
        self,
        machine_id: str,
        decision: str,
        fields: dict[str, Any] | None,
        comment: str,
        attempt: int | None,
    ) -> dict[str, Any]:
        decided = self.client.decide(
            machine_id,
            decision,
            self.identity.actor,
            fields=fields,
            comment=comment,
            via=VIA,
            authority=Authority(admin=self._admin, groups=self.identity.groups),
            attempt=attempt,
        )
        return {"decision": decided}


def _page(found: list[MachineInfo], limit: int) -> dict[str, Any]:
    """A page of machines and the cursor of the next, when one follows."""
    shown = found[:limit]
    more = len(found) > limit
    return {
        "items": [m.to_dict() for m in shown],
        "next": encode_cursor(shown[-1].cursor) if more else None,
    }
