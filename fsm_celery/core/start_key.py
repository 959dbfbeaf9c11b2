"""A start's key (idempotent starts): what makes a key one a start may hold, and what a start
repeated with it must ask the same as the first (its type, its context by digest, its agent and
GitHub issue). Pure: fsm_celery.engine.admin looks the key up and carries the answer out."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from uuid import UUID

from fsm_celery.core.steps import Next, Step
from fsm_celery.exceptions import InvalidStartKey

KEY_CHARS = 200
SAFE_INTEGER = 2**53  # beyond it a float is not an exact whole number in every JSON reader


def checked_key(key: object) -> str:
    """The key, if a start may hold it (1 to 200 printable characters); else InvalidStartKey."""
    if not isinstance(key, str):
        raise InvalidStartKey(key, f"must be text, got {type(key).__name__}")
    if not key:
        raise InvalidStartKey(key, "is empty: give 1 to 200 printable characters, or no key")
    if len(key) > KEY_CHARS:
        raise InvalidStartKey(key, f"is {len(key)} characters long: at most {KEY_CHARS}")
    if not key.isprintable():
        bad = next(c for c in key if not c.isprintable())
        raise InvalidStartKey(key, f"holds {bad!r}: printable characters only, no controls")
    return key


def context_digest(context: Mapping[str, Any]) -> str:
    """The sha256 of the context's canonical JSON: keys sorted, no spaces, UTF-8, a whole
    number written alike whether it came as 1 or 1.0 (as RFC 8785 writes numbers), so that
    one context digests alike whatever client sent it."""
    text = json.dumps(
        _canonical(context),
        sort_keys=True,
        separators=(",", ":"),
        ensure_ascii=False,
        allow_nan=False,
    )
    return hashlib.sha256(text.encode()).hexdigest()


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer() and abs(value) < SAFE_INTEGER:
        return int(value)
    if isinstance(value, Mapping):
        return {str(k): _canonical(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_canonical(v) for v in value]
    return value


@dataclass(frozen=True)
class KeyedStart:
    """What a start with a key asked for: the key holds it, and a start repeated with the key
    must ask the same."""

    key: str
    machine_type: str
    context_digest: str
    agent_id: UUID | None = None
    github_issue: int | None = None


def differences(held: KeyedStart, asked: KeyedStart) -> list[str]:
    """What the start asked differs in from the one the key holds (empty: the same start)."""
    fields = (
        ("type", held.machine_type, asked.machine_type),
        ("context", held.context_digest, asked.context_digest),
        ("agent", held.agent_id, asked.agent_id),
        ("github issue", held.github_issue, asked.github_issue),
    )
    return [name for name, was, now in fields if was != now]


@dataclass(frozen=True)
class Started:
    """A start's outcome: its machine, and the first state to enter; no state when the start's
    key held a machine already (that start entered it: nothing is entered twice)."""

    machine_id: UUID
    step: Step | None

    @property
    def found(self) -> bool:
        """Whether the key's machine was found, rather than started now."""
        return self.step is None

    @property
    def next(self) -> Next:
        return [] if self.step is None else [self.step]
