"""What the Python client (and so the CLI and the HTTP API) hands back: a machine, one attempt of
its history, an agent at work, a definition's version, one machine of a bulk command."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime
from typing import Any
from uuid import UUID

from fsm_celery.core.admin import commands
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.transition import MachineStatus
from fsm_celery.store.queries import AnyRow
from fsm_celery.store.reads import Cursor


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

    @classmethod
    def from_row(cls, row: AnyRow) -> MachineInfo:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

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
class TransitionRecord:
    """One history row: the outcome of one attempt (attempt 0 is the start)."""

    attempt: int
    event: str
    from_state: str | None
    to_state: str
    success: bool
    output: dict[str, Any] | None
    error_message: str | None
    duration_ms: int | None
    actor: str | None
    reason: str | None
    progress: str | None
    agent_id: UUID | None
    tokens_used: int
    cost: float
    created_at: datetime

    @classmethod
    def from_row(cls, row: AnyRow) -> TransitionRecord:
        return cls(**{name: getattr(row, name) for name in cls.__dataclass_fields__})

    def to_dict(self) -> dict[str, Any]:
        return jsonable(asdict(self))


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
