"""What the Python client (and so the CLI and the HTTP API) hands back: a machine, one attempt of
its history, a fan-out's progress, a machine's tree, an agent at work, a definition's version,
one machine of a bulk command; and what a reader may see of a notification's receiver.

A receiver's URL may hold a password, a secret path or a token in its query, and its answer
anything it likes: viewers (and public reads) see the receiver's host and the kind of failure,
admins the path and the answer, nobody the credentials or the query."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from urllib.parse import urlsplit
from uuid import UUID

from fsm_celery.core.admin import commands
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.transition import MachineStatus
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.reads import Cursor, Tree
from fsm_celery.store.tables import machines

HIDDEN = "***"
# how a tree counts the children it does not list: the ended first, then those at work, then
# a map's items not started yet
MORE_ORDER = ("completed", "failed", "cancelled", "running", "paused", "waiting")


_ROW = frozenset(c.name for c in machines.c)


@dataclass(frozen=True)
class MachineInfo:
    """A machine instance as the API shows it."""

    id: UUID
    type: str
    agent_type: str
    agent_id: UUID | None
    current_state: str
    status: str
    context: dict[str, Any]
    attempt: int  # the machine's step: every move, retry and command opens the next
    state_retries: int  # the retries its current state has used
    github_issue: int | None
    definition_version: int
    deadline_at: datetime | None
    heartbeat_at: datetime | None
    progress: str | None
    tokens_used: int
    cost: float
    budget_tokens: int | None
    budget_cost: float | None
    error: str | None
    created_at: datetime
    updated_at: datetime
    # a fan-out's child: its parent, the parent's attempt that started it, its branch (a
    # parallel branch's name, a map item's index), its tree's root and its depth in it
    parent_id: UUID | None = None
    parent_attempt: int | None = None
    branch: str | None = None
    root_id: UUID | None = None
    depth: int = 0
    # waiting for a slot of its agent type since then (FSM_AGENT_TYPE_LIMITS, a definition's
    # agent_types), and its place in that queue (1: next; read for one machine, not in lists)
    queued_at: datetime | None = None
    queue_position: int | None = None
    # a fork: the machine and the step it was started from (its earlier steps are that one's)
    forked_from: UUID | None = None
    forked_at: int | None = None
    # the key it was started with (an idempotent start; read for one machine, not in lists)
    key: str | None = None

    @classmethod
    def from_row(
        cls, row: AnyRow, queue_position: int | None = None, key: str | None = None
    ) -> MachineInfo:
        columns = {name: getattr(row, name) for name in cls.__dataclass_fields__ if name in _ROW}
        return cls(**columns, queue_position=queue_position, key=key)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self)) | {"commands": self.commands}

    @property
    def commands(self) -> list[str]:
        """The operator's commands its status accepts (core/admin.py decides)."""
        return commands(MachineStatus(self.status))

    @property
    def cursor(self) -> Cursor:
        """Where the page after this machine starts (newest first)."""
        return (self.created_at, self.id)


@dataclass(frozen=True)
class Rewinding:
    """A rewind's outcome: the step of the `rewind` row it wrote, and the machine after it."""

    step: int
    machine: MachineInfo


@dataclass(frozen=True)
class TransitionRecord:
    """One history row: the outcome of one attempt (attempt 0 is the start)."""

    attempt: int
    event: str
    from_state: str | None
    to_state: str
    success: bool
    output: dict[str, Any] | None
    error_message: str | None
    failure: str | None  # its kind, when the attempt failed (recorded since migration 0016)
    duration_ms: int | None
    actor: str | None
    reason: str | None
    progress: str | None
    agent_id: UUID | None
    tokens_used: int
    cost: float
    created_at: datetime
    # asked for (Client.history(context=True)): what the step changed in the context, and the
    # context after it (fsm_celery.core.timeline); `known` false for rows recorded before 0014
    change: dict[str, Any] | None = None
    context: dict[str, Any] | None = None
    known: bool | None = None

    @classmethod
    def from_row(
        cls,
        row: AnyRow,
        change: dict[str, Any] | None = None,
        context: dict[str, Any] | None = None,
        known: bool | None = None,
    ) -> TransitionRecord:
        """The row's record (with its context, when asked for: Client.history)."""
        fields = {name: getattr(row, name) for name in ROW_FIELDS}
        return cls(**fields, change=change, context=context, known=known)

    def to_dict(self) -> dict[str, Any]:
        found = asdict(self)
        if self.known is None:  # not asked for: the row as it was
            for name in ASKED:
                found.pop(name)
        return jsonable(found)


ASKED = ("change", "context", "known")  # a TransitionRecord's context, when asked for
ROW_FIELDS = tuple(name for name in TransitionRecord.__dataclass_fields__ if name not in ASKED)


@dataclass(frozen=True)
class FanOutProgress:
    """One fan-out of a machine (an attempt of a parallel, map or machine state): how its
    children stand, counted from their slots (a map's items not started yet are `waiting`)."""

    state: str
    attempt: int
    kind: str  # parallel, map, machine
    total: int
    verdict: str  # pending, met, failed, closed
    done: int  # succeeded
    failed: int
    running: int
    waiting: int
    cancelled: int
    created_at: datetime
    decided_at: datetime | None
    closed_at: datetime | None

    @classmethod
    def from_row(cls, row: AnyRow, slots: dict[str, int]) -> FanOutProgress:
        """The fan_outs row's progress, its children counted from `slots` (status → count)."""
        found: dict[str, Any] = {name: getattr(row, name) for name in FAN_OUT_ROW}
        found |= {name: slots.get(status, 0) for name, status in SLOTS_COUNTED.items()}
        return cls(**found)

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))


# a fan-out's children counted by their slots' status (the rest of its fields: its row's)
SLOTS_COUNTED = {
    "done": "succeeded",
    "failed": "failed",
    "running": "running",
    "waiting": "waiting",
    "cancelled": "cancelled",
}
FAN_OUT_ROW = tuple(n for n in FanOutProgress.__dataclass_fields__ if n not in SLOTS_COUNTED)


@dataclass(frozen=True)
class TreeNode:
    """A machine in its tree: what it is and where it stands, its first children, and the
    others counted by status (`more`; `waiting`: a map's items not started yet)."""

    id: UUID
    type: str
    branch: str | None
    current_state: str
    status: str
    attempt: int
    error: str | None
    children: list[TreeNode]
    more: dict[str, int]

    @classmethod
    def of(cls, tree: Tree, row: AnyRow | None = None) -> TreeNode:
        """The node of `row` (the tree's root by default), its listed children's nodes within."""
        row = tree.root if row is None else row
        listed = tree.children.get(row.id, [])
        left = dict(tree.counts.get(row.id, {}))
        for child in listed:
            left[child.status] = left.get(child.status, 0) - 1
        more = {status: left[status] for status in MORE_ORDER if left.get(status, 0) > 0}
        children = [cls.of(tree, child) for child in listed]
        return cls(**{name: getattr(row, name) for name in NODE_ROW}, children=children, more=more)

    @property
    def hidden(self) -> int:
        """How many children are counted in `more` rather than listed."""
        return sum(self.more.values())

    def to_dict(self) -> dict[str, Any]:
        node = {name: getattr(self, name) for name in self.__dataclass_fields__}
        return jsonable(node) | {"children": [c.to_dict() for c in self.children]}


NODE_ROW = tuple(n for n in TreeNode.__dataclass_fields__ if n not in ("children", "more"))


@dataclass(frozen=True)
class AgentInfo:
    """An agent as it last reported, and the unfinished machines assigned to it now."""

    id: UUID
    agent_type: str
    status: str
    concurrency: int
    running: int
    hostname: str | None
    started_at: datetime
    last_seen_at: datetime
    working_on: list[dict[str, Any]]


@dataclass(frozen=True)
class DefinitionVersion:
    """One stored version of a machine type, parsed, with what the static checker finds."""

    type: str
    version: int
    created_at: datetime
    definition: MachineDefinition
    problems: list[str]
    versions: list[int]  # every version of the type, newest first


@dataclass(frozen=True)
class BulkResult:
    """One machine of a bulk command: done, or why not."""

    machine_id: UUID
    ok: bool
    status: str | None = None
    error: str | None = None


def jsonable(data: dict[str, Any]) -> dict[str, Any]:
    """The mapping with its ids and times as JSON strings."""
    return {
        k: (str(v) if isinstance(v, UUID) else v.isoformat() if isinstance(v, datetime) else v)
        for k, v in data.items()
    }


def redacted_url(url: str, *, host_only: bool) -> str:
    """The URL without its credentials, query and fragment (`***` where they were); only
    scheme://host[:port] when host_only."""
    try:
        parts = urlsplit(url)
        host, port = parts.hostname, parts.port
    except ValueError:
        return HIDDEN
    if not parts.scheme or not host:
        return HIDDEN
    netloc = (f"[{host}]" if ":" in host else host) + (f":{port}" if port is not None else "")
    if host_only:
        return f"{parts.scheme}://{netloc}"
    if "@" in parts.netloc:
        netloc = f"{HIDDEN}@{netloc}"
    query = f"?{HIDDEN}" if parts.query else ""
    return f"{parts.scheme}://{netloc}{parts.path}{query}"


def failure_kind(error: str | None) -> str | None:
    """A notification's last error without the receiver's answer: "HTTP 500", "ConnectError"."""
    return None if error is None else error.split(":", 1)[0][:40]


def notification_view(row: dict[str, Any], *, admin: bool) -> dict[str, Any]:
    """A notification as an admin (the URL's path, the receiver's answer) or anyone else (the
    receiver's host, the kind of failure) may see it."""
    return row | {
        "url": redacted_url(row["url"], host_only=not admin),
        "last_error": row["last_error"] if admin else failure_kind(row["last_error"]),
    }


def definition_view(data: dict[str, Any], *, admin: bool) -> dict[str, Any]:
    """A definition's JSON with its notify URL shown as notification_view shows it."""
    notify = data.get("notify")
    if not isinstance(notify, dict) or not isinstance(notify.get("url"), str):
        return data
    url = redacted_url(notify["url"], host_only=not admin)
    return data | {"notify": notify | {"url": url}}
