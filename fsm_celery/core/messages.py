"""Wire messages between the engine and agents, in the seed's camelCase JSON."""

from __future__ import annotations

import hashlib
import hmac
import json
import math
from collections.abc import Iterable
from datetime import datetime
from typing import Annotated, Any, Literal
from uuid import UUID

from pydantic import BaseModel, ConfigDict, Discriminator, Field, Tag, TypeAdapter
from pydantic.alias_generators import to_camel

TASK_CHANNEL = "channel:agent:{agent}"
ACK_CHANNEL = "channel:state:ack"
TASK_STREAM = "stream:agent:{agent}"
ACK_STREAM = "stream:state:ack"
AGENT_ACK_STREAM = "stream:state:ack:{agent}"
EVENTS_CHANNEL = "channel:state:events"
EVENT_ERROR_CHARS = 1000  # an event names its error; the history row keeps all of it

# Numbers are bounded here, at parse time, to the columns that store them: a number that passed
# the schema but not the database would fail the transaction after its batch was dispatched.
INT32_MAX = 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
Attempt = Annotated[int, Field(ge=0, le=INT32_MAX)]


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
    output_schema: dict[str, Any] | None = Field(
        default=None,
        description="the JSON Schema 2020-12 the output must match (requiredOutput merged in); "
        "absent when the state declares none",
    )
    traceparent: str | None = Field(
        default=None,
        max_length=55,
        description="the W3C Trace Context of the attempt's span, for the agent's own spans to "
        "nest under; absent when the engine does not trace (docs/operations.md, Traces)",
    )


class StateCancel(_Message):
    """Engine → agent: stop working on this attempt and send nothing for it; an operator's
    command (pause, cancel, retry, force) or its deadline superseded it, and its ack would be
    refused as stale.

    Sent on the agent's task stream only (pub/sub agents of the seed's protocol do not know
    it), once the move committed. It echoes the attempt's taskToken, so an agent cancels
    only the task it holds: the token is known only to the engine and the task's reader.
    """

    type: Literal["state_cancel"] = "state_cancel"
    machine_id: UUID
    state: str
    attempt: int
    task_token: str = Field(description="the taskToken of the state_task it cancels")
    reason: str = Field(description="who superseded the attempt, how and why")


class ContractProblem(_Message):
    """One way an answer breaks its state's contract."""

    pointer: str = Field(description="a JSON pointer into the output ('': the output itself)")
    message: str


class StateAckRefused(_Message):
    """Engine → agent: the answer sent for this attempt breaks its state's contract, and nothing
    moved; send a corrected state_ack for the same attempt (its deadline runs on) while
    correctionsLeft allows, after which a wrong answer is the attempt's failure.

    Sent on the agent's task stream, as a state_cancel, once the refusal committed. It echoes
    the attempt's taskToken, so an agent corrects only the task it holds.
    """

    type: Literal["state_ack_refused"] = "state_ack_refused"
    machine_id: UUID
    machine_type: str
    state: str
    attempt: int
    task_token: str = Field(description="the taskToken of the state_task whose answer it refuses")
    problems: list[ContractProblem] = Field(max_length=20)
    corrections_left: int = Field(
        ge=0, description="corrected answers still allowed after this refusal's one"
    )


class StateAck(_Message):
    """Agent → engine: the outcome of one state attempt."""

    type: Literal["state_ack"]
    machine_id: UUID
    state: str = Field(max_length=50)
    success: bool
    output: dict[str, Any] = Field(default_factory=dict)
    error: str | None = None
    attempt: Attempt | None = None
    task_token: str | None = Field(default=None, max_length=128)
    traceparent: str | None = Field(
        default=None,
        max_length=256,
        description="the W3C Trace Context of the agent's span that sent it (optional): the "
        "fsm.apply_acks task that applies it is traced under it",
    )


class StateHeartbeat(_Message):
    """Agent → engine: still working on the attempt; pushes its deadline out."""

    type: Literal["state_heartbeat"]
    machine_id: UUID
    state: str = Field(max_length=50)
    attempt: Attempt | None = None
    task_token: str | None = Field(default=None, max_length=128)
    progress: str | None = Field(default=None, max_length=2000)


class StateHandBack(_Message):
    """Agent → engine: I cannot do this attempt (shutting down): send it again, to another
    agent if one is live, without counting a retry."""

    type: Literal["state_handback"]
    machine_id: UUID
    state: str = Field(max_length=50)
    attempt: Attempt
    task_token: str = Field(max_length=128)
    reason: str | None = Field(default=None, max_length=2000)


class AgentStatus(_Message):
    """Agent → engine: I am here (sent every few seconds), or I am stopping."""

    type: Literal["agent_status"]
    agent_id: UUID
    agent_type: str = Field(min_length=1, max_length=10)
    status: Literal["active", "stopped"]
    concurrency: int = Field(ge=1, le=INT32_MAX)
    running: int = Field(default=0, ge=0, le=INT32_MAX)
    hostname: str | None = Field(default=None, max_length=255)


class StateEvent(_Message):
    """Engine → whoever listens on channel:state:events (the dashboard, notifications, your
    tools): a machine started or moved. Sent once its transaction committed; pub/sub, so a
    listener that is away misses it (the history in PostgreSQL is the record)."""

    type: Literal["state_event"] = "state_event"
    machine_id: UUID
    machine_type: str
    agent_type: str
    agent_id: UUID | None = None
    github_issue: int | None = None
    parent_id: UUID | None = Field(
        default=None, description="the machine whose fan-out started it (none: a top-level one)"
    )
    root_id: UUID | None = Field(
        default=None, description="the top-level machine of its tree (none: it is one)"
    )
    event: str = Field(
        description="what moved it: start, ack, timeout, handback, dispatch_error, or an "
        "operator's pause, resume, cancel, retry, force; or refused: an answer sent back to "
        "its agent to correct, the machine where it was"
    )
    from_state: str | None = None
    to_state: str
    status: str = Field(description="the machine's status after it: running, paused, ...")
    attempt: int = Field(description="the attempt it ended (0: the start)")
    state_retries: int = Field(
        default=0, description="the retries the state it moved to has used (0: its first try)"
    )
    success: bool
    error: str | None = Field(default=None, max_length=EVENT_ERROR_CHARS)
    actor: str | None = None
    duration_ms: int | None = Field(
        default=None, description="how long the attempt it ended took, as in the history"
    )
    at: datetime

    def to_wire(self) -> str:
        """The JSON text, every key present (null when empty): one shape for listeners."""
        return self.model_dump_json(by_alias=True)


MachineMessage = StateAck | StateHeartbeat | StateHandBack
AnyAgentMessage = StateAck | StateHeartbeat | StateHandBack | AgentStatus
AgentMessage = Annotated[AnyAgentMessage, Field(discriminator="type")]
AGENT_MESSAGE: TypeAdapter[AnyAgentMessage] = TypeAdapter(AgentMessage)


def _task_kind(value: Any) -> str:
    kind = value.get("type") if isinstance(value, dict) else getattr(value, "type", None)
    return "state_task" if kind is None else str(kind)  # seed-style tasks may omit it


AnyTaskMessage = StateTask | StateCancel | StateAckRefused
TASK_MESSAGE: TypeAdapter[AnyTaskMessage] = TypeAdapter(
    Annotated[
        Annotated[StateTask, Tag("state_task")]
        | Annotated[StateCancel, Tag("state_cancel")]
        | Annotated[StateAckRefused, Tag("state_ack_refused")],
        Discriminator(_task_kind),
    ]
)
TASK_MESSAGE_TYPES = ("state_task", "state_cancel", "state_ack_refused")


def parse_task_message(raw: str | bytes) -> AnyTaskMessage:
    """Parse what an agent reads from its task stream: a state_task, a state_cancel or a
    state_ack_refused
    (ValidationError says what is wrong, each error's location led by the message type)."""
    return TASK_MESSAGE.validate_json(raw)


def parse_agent_message(raw: str | bytes) -> AnyAgentMessage:
    """Parse an ack, heartbeat, hand-back or agent status (ValidationError says what is wrong)."""
    return AGENT_MESSAGE.validate_json(raw)


def unstorable(value: object, path: str = "message") -> str | None:
    """Where the value holds what PostgreSQL cannot store, and what, or None.

    JSON allows it all: a NUL character (\\u0000) in a string or key, which text and jsonb
    refuse; NaN and Infinity (and 1e400, read as Infinity), which JSON types refuse; and whole
    numbers past 64 bits, which a bigint column refuses.
    """
    for where, item in _walk(value, path):
        problem = _unstorable_scalar(item)
        if problem is not None:
            return f"{where}: {problem}"
    return None


def json_problem(value: object, path: str, most: int) -> str | None:
    """Why the value cannot be stored as JSON of at most `most` bytes: not JSON, too large, or
    holding what PostgreSQL refuses (unstorable); or None."""
    try:
        size = len(json.dumps(value, allow_nan=False).encode())
    except (TypeError, ValueError, RecursionError) as exc:
        return f"{path}: not JSON ({exc})"
    if size > most:
        return f"{path}: {size} bytes, over {most}"
    return unstorable(value, path)


def _walk(value: object, path: str) -> Iterable[tuple[str, object]]:
    stack = [(path, value)]
    while stack:
        where, item = stack.pop()
        if isinstance(item, dict):
            for key, child in item.items():
                yield f"{where} key", key
                stack.append((f"{where}.{key}", child))
        elif isinstance(item, list | tuple):
            stack.extend((f"{where}[{i}]", child) for i, child in enumerate(item))
        else:
            yield where, item


def _unstorable_scalar(item: object) -> str | None:
    if isinstance(item, str):
        return "holds a NUL character (\\u0000)" if "\x00" in item else None
    if isinstance(item, float):
        return None if math.isfinite(item) else f"{item} is not a finite number"
    if isinstance(item, int) and not isinstance(item, bool):
        return None if INT64_MIN <= item <= INT64_MAX else f"{item} does not fit in 64 bits"
    return None


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
    """The shared stream agents XADD acks and heartbeats to (the durable path, no identity)."""
    return prefix + ACK_STREAM


def agent_ack_stream(agent: str, prefix: str = "") -> str:
    """The agent's own ack stream: only it may write there, so it names who sent each entry."""
    return prefix + AGENT_ACK_STREAM.format(agent=agent)


def events_channel(prefix: str = "") -> str:
    """The pub/sub channel every committed transition is announced on."""
    return prefix + EVENTS_CHANNEL


def task_token(secret: str, machine_id: UUID | str, state: str, attempt: int) -> str:
    """An HMAC that binds an ack to one machine, state and attempt."""
    body = f"{machine_id}|{state}|{attempt}".encode()
    return hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


def token_matches(secrets: Iterable[str], message: MachineMessage, attempt: int) -> bool:
    """Whether the message carries the token issued for that attempt under one of the secrets
    (the current one, or one being rotated out)."""
    if message.task_token is None:
        return False
    given = message.task_token.encode()
    bound = (message.machine_id, message.state, attempt)
    return any(hmac.compare_digest(task_token(s, *bound).encode(), given) for s in secrets)


def message_schemas() -> dict[str, dict[str, Any]]:
    """JSON Schemas of every wire message, keyed by message type."""
    return {
        "state_task": StateTask.model_json_schema(by_alias=True),
        "state_cancel": StateCancel.model_json_schema(by_alias=True),
        "state_ack_refused": StateAckRefused.model_json_schema(by_alias=True),
        "state_ack": StateAck.model_json_schema(by_alias=True),
        "state_heartbeat": StateHeartbeat.model_json_schema(by_alias=True),
        "state_handback": StateHandBack.model_json_schema(by_alias=True),
        "agent_status": AgentStatus.model_json_schema(by_alias=True),
        "state_event": StateEvent.model_json_schema(by_alias=True),
    }


def schemas_json() -> str:
    """The JSON Schemas as one indented document."""
    return json.dumps(message_schemas(), indent=2, sort_keys=True)
