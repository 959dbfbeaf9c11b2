"""Waiting on outside events: a state that waits for a named event (a PR merged, CI finished,
a person's go), not an agent. Pure.

A wait names its event and, optionally, the JSON Schema its payload must match; the state's
`on_event` edges read the payload as the output (`output.merged`), its `timeout` is how long it
waits and `on_timeout` the state it goes to then. An event that arrives before its machine
waits for it is kept (a few per machine and name, FSM_MAX_KEPT_EVENTS) and consumed when the
state is entered: a fast CI and a slow agent do not race (fsm_celery.engine.signals).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from fsm_celery.core.context import context_problem
from fsm_celery.core.timeline import ACTOR_CHARS

EVENT_PATTERN = r"^[a-z][a-z0-9_]{0,49}$"
MAX_PAYLOAD_BYTES = 65_536  # an event's payload, as JSON (and FSM_MAX_PAYLOAD_BYTES)
SENDER_CHARS = ACTOR_CHARS  # the event's sender is its transition's actor
KEY_CHARS = 100


class Wait(BaseModel):
    """What a waiting state waits for: an event's name, and the form of its payload."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    event: str = Field(pattern=EVENT_PATTERN)
    form: dict[str, Any] | None = Field(default=None, alias="schema")


def payload_problem(wait: Wait, payload: Mapping[str, Any]) -> str | None:
    """Why the payload does not match the wait's schema, or None."""
    return None if wait.form is None else context_problem(wait.form, payload)


def waiting_for(states: Iterable[Any], event: str) -> list[Any]:
    """The states (of a definition) that wait for the event."""
    return [s for s in states if s.wait is not None and s.wait.event == event]


def events_of(states: Iterable[Any]) -> list[str]:
    """Every event the states wait for, each once, in order."""
    return list(dict.fromkeys(s.wait.event for s in states if s.wait is not None))
