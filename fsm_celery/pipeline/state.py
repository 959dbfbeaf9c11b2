"""TaskState: the one serialisable record that flows through the research pipeline."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field, fields
from enum import StrEnum
from typing import Any


class TaskStatus(StrEnum):
    """Every legal status of a research task (ADR-001)."""

    PENDING = "PENDING"
    RESEARCHING = "RESEARCHING"
    ANALYZING = "ANALYZING"
    REVIEWING = "REVIEWING"
    COMPLETE = "COMPLETE"
    FAILED = "FAILED"


@dataclass(frozen=True)
class Message:
    """One entry of the audit trail: which agent said what, in which iteration."""

    agent: str
    content: str
    iteration: int = 0

    def to_dict(self) -> dict[str, Any]:
        return {"agent": self.agent, "content": self.content, "iteration": self.iteration}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Message:
        return cls(data["agent"], data["content"], data["iteration"])


@dataclass
class TaskState:
    """The shared state every agent reads and returns (never mutating the one it was given)."""

    query: str
    status: TaskStatus = TaskStatus.PENDING
    findings: list[str] = field(default_factory=list)
    sources: list[str] = field(default_factory=list)
    analysis: str = ""
    feedback: str = ""
    approved: bool = False
    iteration: int = 0
    max_iterations: int = 3
    messages: list[Message] = field(default_factory=list)
    error: str | None = None
    metadata: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict; from_dict(to_dict()) gives an equal state."""
        data = {f.name: copy.deepcopy(getattr(self, f.name)) for f in fields(self)}
        data["status"] = self.status.value
        data["messages"] = [m.to_dict() for m in self.messages]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskState:
        """The state a to_dict() produced."""
        known = {f.name for f in fields(cls)}
        unknown = set(data) - known
        if unknown:
            raise ValueError(f"unknown TaskState fields: {', '.join(sorted(unknown))}")
        values = copy.deepcopy(data)
        values["status"] = TaskStatus(values.get("status", TaskStatus.PENDING))
        values["messages"] = [Message.from_dict(m) for m in values.get("messages", [])]
        return cls(**values)

    def said(self, agent: str, content: str) -> list[Message]:
        """The messages with one more from the agent."""
        return [*self.messages, Message(agent, content, self.iteration)]
