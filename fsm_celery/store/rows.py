"""The rows the engine writes, typed: each field is a column of its table, by the same name.

The store builds its statements from these fields (fsm_celery.store.queries), so a value the
engine decides and the column it lands in cannot drift apart: a field that is not a column
fails the unit test that compares them with the schema, not a transaction in production.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from datetime import datetime
from operator import attrgetter
from typing import Any
from uuid import UUID

from sqlalchemy import BigInteger, Column, Float, Integer, SmallInteger, String, Table, Text
from sqlalchemy.types import TypeEngine

from fsm_celery.store.tables import agents, machines, rejected_messages, transitions


@dataclass(slots=True)
class NewMachine:
    """A machine as it is started (state_machines)."""

    id: UUID
    type: str
    agent_type: str
    current_state: str
    context: dict[str, Any]
    status: str
    github_issue: int | None
    created_at: datetime
    updated_at: datetime
    definition_version: int
    agent_id: UUID | None
    agent_pinned: bool
    budget_tokens: int | None
    budget_cost: float | None
    attempt: int
    state_retries: int
    dispatch_due_at: datetime
    # a fan-out's child: where it stands in its parent's (fsm_celery.engine.kinds.fanout)
    parent_id: UUID | None = None
    parent_attempt: int | None = None
    slot: int | None = None
    branch: str | None = None
    root_id: UUID | None = None
    depth: int = 0
    on_parent_cancel: str | None = None
    # a fork: the machine it was started from, and the step of it (fsm_celery.engine.travel)
    forked_from: UUID | None = None
    forked_at: int | None = None


@dataclass(slots=True)
class Move:
    """A machine's new state after a transition (an UPDATE of state_machines by id). When the
    state it moved to is entered in the same transaction, its dispatch is recorded here too."""

    id: UUID
    current_state: str
    status: str
    context: dict[str, Any]
    attempt: int
    state_retries: int
    handbacks: int
    dispatch_due_at: datetime | None
    deadline_at: datetime | None
    heartbeat_at: datetime | None
    progress: str | None
    tokens_used: int
    cost: float
    entered_at: datetime | None
    error: str | None
    updated_at: datetime
    agent_type: str  # who works the state it moved to
    agent_id: UUID | None  # its agent, kept while the agent type stays (or it is pinned)
    queued_at: datetime | None = None  # waiting for a slot of its agent type (engine.slots)
    corrections: int = 0  # a new attempt has had no answer refused


@dataclass(slots=True)
class Correction:
    """An answer of the machine's attempt refused: how many the attempt has had (an UPDATE by
    id; the Move to its next attempt sets it back to 0)."""

    id: UUID
    corrections: int
    updated_at: datetime


@dataclass(slots=True)
class Dispatch:
    """A state entered: its task sent now, with its deadline, or queued for a slot of its
    agent type (an UPDATE by id)."""

    id: UUID
    dispatch_due_at: None
    entered_at: datetime
    deadline_at: datetime | None  # None: queued for a slot of its agent type, no deadline yet
    updated_at: datetime
    agent_id: UUID | None  # the agent it was routed to (None: its type's stream)
    queued_at: datetime | None = None  # waiting for a slot since then (engine.slots)


@dataclass(slots=True)
class Beat:
    """A sign of life from the agent: a later deadline and its progress (an UPDATE by id)."""

    id: UUID
    deadline_at: datetime
    heartbeat_at: datetime
    progress: str | None


@dataclass(slots=True)
class History:
    """The record of one attempt (state_transitions)."""

    machine_id: UUID
    from_state: str | None
    to_state: str
    success: bool
    output: dict[str, Any] | None
    error_message: str | None
    duration_ms: int | None
    attempt: int
    event: str
    actor: str | None
    reason: str | None
    progress: str | None
    agent_id: UUID | None
    tokens_used: int
    cost: float
    created_at: datetime
    machine_created_at: datetime  # its machine's created_at: the partition key (store.tables)
    context_delta: dict[str, Any] | None = None  # what the transition changed in the context
    failure: str | None = None  # the kind of a failed transition (FailureKind)
    correction: int = 0  # an answer refused within the attempt: its nth (0: the attempt's row)


@dataclass(slots=True)
class Rejection:
    """A message that changed nothing, and why (rejected_messages)."""

    reason: str
    detail: str
    payload: str
    received_at: datetime
    machine_id: UUID | None
    state: str | None
    attempt: int | None


@dataclass(slots=True)
class AgentReport:
    """An agent's latest status (agents, inserted the first time it reports)."""

    id: UUID
    agent_type: str
    status: str
    concurrency: int
    running: int
    hostname: str | None
    started_at: datetime
    last_seen_at: datetime


Row = NewMachine | Move | Dispatch | Beat | Correction | History | Rejection | AgentReport
ById = Move | Dispatch | Beat | Correction  # written by an UPDATE ... WHERE id = the row's id


def columns(kind: type[Row]) -> tuple[str, ...]:
    """The columns a row type writes, in field order."""
    names = _COLUMNS.get(kind)
    if names is None:
        names = _COLUMNS[kind] = tuple(f.name for f in fields(kind))
    return names


_COLUMNS: dict[type[Row], tuple[str, ...]] = {}


def values(row: Row) -> dict[str, Any]:
    """The row as column → value (shallow: its JSON values are passed as they are)."""
    return {name: getattr(row, name) for name in columns(type(row))}


# ---- what each column can hold ------------------------------------------------------------

TABLES: dict[type[Row], Table] = {
    NewMachine: machines,
    Move: machines,
    Dispatch: machines,
    Beat: machines,
    Correction: machines,
    History: transitions,
    Rejection: rejected_messages,
    AgentReport: agents,
}
WHOLE, DOUBLE, TEXT = 0, 1, 2
Limit = tuple[str, int, int | None]  # a column, its kind, and its bound (range, length)
_LIMITS: dict[type[Row], tuple[Callable[[Row], Any], tuple[Limit, ...]]] = {}


def unfit(row: Row) -> str | None:
    """Which value of the row its column cannot hold, and why, or None.

    The numbers and text PostgreSQL refuses (a whole number past the column's range, NaN or
    infinity, a NUL character, a string longer than its column) are found here, before the
    transaction's state_tasks are sent; JSON values are checked where they arrive (intake).
    On every transition: one attribute fetch per row and no call per column.
    """
    found = _LIMITS.get(type(row))
    if found is None:
        found = _LIMITS[type(row)] = _limits(type(row))
    get, limits = found
    for value, (name, kind, bound) in zip(get(row), limits, strict=True):
        if value is None:
            continue
        if kind == WHOLE:
            assert bound is not None
            if -bound <= value < bound:
                continue
            return f"{name} {value} does not fit its column (from {-bound} to {bound - 1})"
        if kind == DOUBLE:
            if math.isfinite(value):
                continue
            return f"{name} {value} is not a finite number"
        if "\x00" in value:
            return f"{name} holds a NUL character (\\u0000)"
        if bound is not None and len(value) > bound:
            return f"{name} is {len(value)} characters long, over its column's {bound}"
    return None


def _limits(kind: type[Row]) -> tuple[Callable[[Row], Any], tuple[Limit, ...]]:
    table = TABLES[kind]
    limits = []
    for name in columns(kind):
        limit = _limit(table.c[name].type)
        if limit is not None:
            limits.append((name, *limit))
    getter = attrgetter(*(name for name, _, _ in limits))
    return (lambda row: (getter(row),)) if len(limits) == 1 else getter, tuple(limits)


def most(column: Column[Any]) -> int:
    """The largest whole number, or the most characters, a column holds (what a door that
    takes a value for it bounds the value by)."""
    kind, bound = _limit(column.type) or (None, None)
    if bound is None:
        raise TypeError(f"{column} has no bound (a whole number or a string of some length)")
    return bound - 1 if kind == WHOLE else bound


def _limit(kind: TypeEngine[Any]) -> tuple[int, int | None] | None:
    if isinstance(kind, SmallInteger):
        return WHOLE, 2**15
    if isinstance(kind, BigInteger):
        return WHOLE, 2**63
    if isinstance(kind, Integer):
        return WHOLE, 2**31
    if isinstance(kind, Float):
        return DOUBLE, None
    if isinstance(kind, String):  # Text too
        return TEXT, None if isinstance(kind, Text) else kind.length
    return None
