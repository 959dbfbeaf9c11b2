"""Raw payloads from agents → a message, or the reason it is refused. Pure.

Everything that arrives over Redis is untrusted until it passes here: its size, its JSON, its
schema (numbers bounded to the columns that store them) and every value PostgreSQL would refuse
are checked before the message reaches a transaction, so one bad message can never roll back
the batch it arrived in (whose next states were already dispatched).
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from pydantic import ValidationError

from fsm_celery.core.messages import (
    INT32_MAX,
    AgentStatus,
    AnyAgentMessage,
    MachineMessage,
    parse_agent_message,
    token_matches,
    unstorable,
)
from fsm_celery.core.transition import RejectReason

# What may hide a value PostgreSQL refuses; only a payload with one of these is walked. A JSON
# number follows ":", "," or "["; hex in a token or an id ("3e5") is inside quotes and does not.
_SUSPECT = re.compile(r"\\u0000|NaN|Infinity|[:,\[]\s*-?(?:\d+(?:\.\d*)?[eE]|\d{19})")


@dataclass(frozen=True)
class Refused:
    """A payload that changes nothing: why, and what it was about as far as it could be read."""

    reason: RejectReason
    detail: str
    machine_id: UUID | None = None
    state: str | None = None
    attempt: int | None = None


def where(message: AnyAgentMessage) -> dict[str, Any]:
    """Which machine, state and attempt a message is about (nothing for an agent status)."""
    if isinstance(message, AgentStatus):
        return {}
    return {"machine_id": message.machine_id, "state": message.state, "attempt": message.attempt}


def parse(raw: str, max_bytes: int) -> AnyAgentMessage | Refused:
    """The message the payload holds, or why it is refused."""
    if len(raw) * 4 > max_bytes and len(raw.encode("utf-8", "surrogatepass")) > max_bytes:
        return Refused(RejectReason.OVERSIZED, f"payload over {max_bytes} bytes")
    try:
        message = parse_agent_message(raw)
    except ValidationError as exc:
        if any(e["type"] == "json_invalid" for e in exc.errors()):
            return Refused(RejectReason.MALFORMED_JSON, describe(exc))
        return Refused(RejectReason.SCHEMA_VIOLATION, describe(exc), **_salvage(raw))
    if _SUSPECT.search(raw):
        problem = unstorable(message.model_dump(by_alias=True), "message")
        if problem is not None:
            return Refused(RejectReason.INVALID_VALUE, problem, **where(message))
    return message


def forged(message: MachineMessage, secrets: Sequence[str], accept_unsigned: bool) -> bool:
    """Whether the message's token is wrong for the machine, state and attempt it names: known
    before its machine's row is locked, so a flood of forgeries holds no lock."""
    if message.task_token is None:
        return not accept_unsigned
    return message.attempt is None or not token_matches(secrets, message, message.attempt)


def attempt_of(message: MachineMessage, current: int) -> int:
    """The attempt a message that passed `forged` is for: the one it names, or, unsigned and
    naming none, the machine's current one."""
    return current if message.attempt is None else message.attempt


def _salvage(raw: str) -> dict[str, Any]:
    """What a message that broke the schema says it is about, as far as that can be trusted
    to fit the record (so an operator finds it under its machine)."""
    try:
        data = json.loads(raw)
        machine_id = UUID(str(data["machineId"]))
    except (ValueError, TypeError, KeyError, RecursionError):
        return {}
    state, attempt = data.get("state"), data.get("attempt")
    return {
        "machine_id": machine_id,
        "state": state[:50] if isinstance(state, str) else None,
        "attempt": attempt if isinstance(attempt, int) and 0 <= attempt <= INT32_MAX else None,
    }


def describe(exc: ValidationError) -> str:
    """Pydantic's errors as one line: field: what is wrong; …"""
    return "; ".join(
        f"{'.'.join(str(p) for p in e['loc']) or 'message'}: {e['msg']}" for e in exc.errors()
    )
