"""Wire messages between the engine and agents, in the seed's camelCase JSON."""

from __future__ import annotations

import hashlib
import hmac
import json
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter
from pydantic.alias_generators import to_camel

TASK_CHANNEL = "channel:agent:{agent}"
ACK_CHANNEL = "channel:state:ack"
TASK_STREAM = "stream:agent:{agent}"
ACK_STREAM = "stream:state:ack"


class _Message(BaseModel):
    model_config = ConfigDict(
        alias_generator=to_camel,
        populate_by_name=True,
        extra="ignore",
        frozen=True,
        strict=True,  # a wire protocol: "yes" is not a boolean, "3" is not an attempt
    )

    def to_wire(self) -> str:
        """The JSON text sent over Redis."""
        return self.model_dump_json(by_alias=True, exclude_none=True)


class StateTask(_Message):
    """Engine → agent: do the work of one state attempt."""

    type: Literal["state_task"] = "state_task"
    machine_id: UUID
    machine_type: str
    state: str
    attempt: int
    context: dict[str, Any]
    prompt: str
    required_output: list[str]
    timeout: int = Field(description="milliseconds the agent has, as in the seed")
    deadline: datetime
    task_token: str
    heartbeat_timeout: int | None = Field(
        default=None, description="milliseconds of silence allowed between heartbeats"
    )


class StateAck(_Message):
    """Agent → engine: the outcome of one state attempt."""

    type: Literal["state_ack"]
    machine_id: UUID
    state: str = Field(max_length=50)
    success: bool
    output: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    attempt: int | None = Field(default=None, ge=0)
    task_token: str | None = None


class StateHeartbeat(_Message):
    """Agent → engine: still working on the attempt; pushes its deadline out."""

    type: Literal["state_heartbeat"]
    machine_id: UUID
    state: str = Field(max_length=50)
    attempt: int | None = Field(default=None, ge=0)
    task_token: str | None = None
    progress: str | None = Field(default=None, max_length=2000)


class AgentStatus(_Message):
    """Agent → engine: I am here (sent every few seconds), or I am stopping."""

    type: Literal["agent_status"]
    agent_id: UUID
    agent_type: str = Field(min_length=1, max_length=10)
    status: Literal["active", "stopped"]
    concurrency: int = Field(ge=1)
    running: int = Field(default=0, ge=0)
    hostname: str | None = Field(default=None, max_length=255)


MachineMessage = StateAck | StateHeartbeat
AgentMessage = Annotated[StateAck | StateHeartbeat | AgentStatus, Field(discriminator="type")]
AGENT_MESSAGE: TypeAdapter[StateAck | StateHeartbeat | AgentStatus] = TypeAdapter(AgentMessage)


def parse_agent_message(raw: str | bytes) -> StateAck | StateHeartbeat | AgentStatus:
    """Parse an ack, heartbeat or agent status (pydantic's ValidationError says what is wrong)."""
    return AGENT_MESSAGE.validate_json(raw)


def holds_nul(value: object) -> bool:
    """Whether a parsed message (or any part of it) holds a NUL character in a key or a string:
    valid JSON (as \\u0000) that PostgreSQL's text and jsonb cannot store."""
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, dict):
        return any(holds_nul(k) or holds_nul(v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(holds_nul(v) for v in value)
    return False


def task_channel(agent: str, prefix: str = "") -> str:
    """The pub/sub channel an agent (uuid, or agent type when unassigned) listens on."""
    return prefix + TASK_CHANNEL.format(agent=agent)


def ack_channel(prefix: str = "") -> str:
    """The pub/sub channel agents publish acks on."""
    return prefix + ACK_CHANNEL


def task_stream(agent: str, prefix: str = "") -> str:
    """The stream that keeps an agent's tasks until it reads them (the durable path)."""
    return prefix + TASK_STREAM.format(agent=agent)


def ack_stream(prefix: str = "") -> str:
    """The stream agents XADD acks and heartbeats to (the durable path)."""
    return prefix + ACK_STREAM


def task_token(secret: str, machine_id: UUID | str, state: str, attempt: int) -> str:
    """An HMAC that binds an ack to one machine, state and attempt."""
    body = f"{machine_id}|{state}|{attempt}".encode()
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def token_matches(secret: str, ack: StateAck | StateHeartbeat, attempt: int) -> bool:
    """Whether the message carries the token issued for that attempt."""
    if ack.task_token is None:
        return False
    expected = task_token(secret, ack.machine_id, ack.state, attempt)
    return hmac.compare_digest(expected, ack.task_token)


def message_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schemas of every wire message, keyed by message type."""
    return {
        "state_task": StateTask.model_json_schema(by_alias=True),
        "state_ack": StateAck.model_json_schema(by_alias=True),
        "state_heartbeat": StateHeartbeat.model_json_schema(by_alias=True),
        "agent_status": AgentStatus.model_json_schema(by_alias=True),
    }


def schemas_json() -> str:
    """The JSON Schemas as one indented document."""
    return json.dumps(message_schemas(), indent=2, sort_keys=True)
