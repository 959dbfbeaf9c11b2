"""A machine's trace and its attempts' spans, named without asking anyone: the trace id is the
root machine's uuid (its 128 bits, as Jaeger or Tempo search it: the uuid's 32 hex digits), a
span id a hash of (machine, attempt), so that the worker that sends a state_task, the agent that
works it and the process that decides it name the same span (W3C Trace Context). Pure: no
OpenTelemetry here."""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple
from uuid import UUID

VERSION = "00"
SAMPLED = 0x01
_TRACEPARENT = re.compile(r"^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})$")
_IN_MESSAGE = re.compile(r'"traceparent"\s*:\s*"([^"]{1,256})"')
SEARCHED = 8192  # characters of a raw message looked through for its traceparent


class Parent(NamedTuple):
    """A span named on the wire: its trace, its own id and its flags."""

    trace_id: int
    span_id: int
    flags: int = SAMPLED


def trace_id(machine_id: UUID, root_id: UUID | None = None) -> int:
    """The trace of a machine: its root machine's (a top-level machine is its own root)."""
    return (root_id or machine_id).int


def _span(*parts: object) -> int:
    digest = hashlib.sha256("|".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "big") or 1  # 0 is W3C's "no span"


def attempt_span_id(machine_id: UUID, attempt: int) -> int:
    """The span of one attempt of a machine: its entry to its decision."""
    return _span(machine_id, attempt)


def machine_span_id(machine_id: UUID) -> int:
    """The span of a machine's whole run: the parent of its attempts and of its children's."""
    return _span(machine_id, "machine")


def attempt_parent(machine_id: UUID, root_id: UUID | None, attempt: int) -> Parent:
    """The attempt's span, as what is sent for it names it as parent."""
    return Parent(trace_id(machine_id, root_id), attempt_span_id(machine_id, attempt))


def traceparent(parent: Parent) -> str:
    """The W3C traceparent header of a span."""
    return f"{VERSION}-{parent.trace_id:032x}-{parent.span_id:016x}-{parent.flags:02x}"


def parse_traceparent(value: str | None) -> Parent | None:
    """The span a W3C traceparent names; None for none, or one malformed (W3C: ignore it)."""
    found = _TRACEPARENT.match(value.strip().lower()) if value else None
    if found is None or found.group(1) == "ff":
        return None
    trace, span = int(found.group(2), 16), int(found.group(3), 16)
    if trace == 0 or span == 0:
        return None
    return Parent(trace, span, int(found.group(4), 16))


def traceparent_in(raw: str) -> Parent | None:
    """The span a raw message's `traceparent` names (a state_ack's: the agent's that sent it),
    found without parsing the message; None when it names none."""
    found = _IN_MESSAGE.search(raw[:SEARCHED])
    return parse_traceparent(found.group(1)) if found else None
