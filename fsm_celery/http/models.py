"""The HTTP API's request bodies and query filters: bounded to what the columns hold, so that
bad input is a 422 naming the field, never a database error."""

from __future__ import annotations

import json
from datetime import datetime
from typing import Annotated, Any, Literal, Self
from uuid import UUID

from fastapi import Query
from fastapi.exceptions import RequestValidationError
from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Field,
    ValidationError,
    model_validator,
)

from fsm_celery.core.messages import unstorable
from fsm_celery.core.transition import MachineStatus
from fsm_celery.http.examples import REQUESTS
from fsm_celery.store.reads import MachineFilter
from fsm_celery.store.rows import most
from fsm_celery.store.tables import definitions, machine_events, machines, transitions

# What the API takes is bounded by the column it is stored in (fsm_celery.store.tables).
# a machine's type: a definition's, or a child's named by its place (`research_fanout.EACH`)
TYPE_CHARS = most(machines.c.type)
AGENT_TYPE_CHARS = most(machines.c.agent_type)
STEP_MOST = most(transitions.c.attempt)  # a machine's step (its attempt)
VERSION_MOST = most(definitions.c.version)
DEFINITION_CHARS = most(definitions.c.type)
EVENT_CHARS = most(machine_events.c.name)
Name = Annotated[str, Field(min_length=1, max_length=most(machines.c.current_state))]
Definition = Annotated[str, Field(min_length=1, max_length=DEFINITION_CHARS)]
MachineType = Annotated[str, Field(min_length=1, max_length=TYPE_CHARS)]
Actor = Annotated[str, Field(min_length=1, max_length=most(transitions.c.actor))]
Reason = Annotated[str, Field(max_length=2000)]
Issue = Annotated[int, Field(ge=0, le=most(machines.c.github_issue))]


def _examples(schema: dict[str, Any], model: type[BaseModel]) -> None:
    """A body's examples in the OpenAPI document (http/examples.py)."""
    found = REQUESTS.get(model.__name__)
    if found is not None:
        schema["examples"] = found


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", json_schema_extra=_examples)

    @model_validator(mode="after")
    def _storable(self) -> Self:
        """Refuse what PostgreSQL cannot store (a NUL, a lone surrogate, NaN, 2**64) here,
        naming the field, rather than as a database error."""
        for name in type(self).model_fields:
            value = getattr(self, name)
            problem = unstorable(value, name)
            if problem is not None:
                raise ValueError(problem)
            try:
                json.dumps(value, default=str, ensure_ascii=False).encode()
            except UnicodeEncodeError as exc:
                raise ValueError(f"{name}: holds a lone surrogate (not UTF-8)") from exc
        return self


class StartRequest(_Body):
    type: Definition
    context: dict[str, Any] = Field(default_factory=dict)
    agent_id: UUID | None = None
    github_issue: Issue | None = None
    key: str | None = Field(
        default=None,
        description="the start's key (or the Idempotency-Key header): 1 to 200 printable "
        "characters; started again with it, the same machine",
    )


class CommandRequest(_Body):
    reason: Reason = ""
    actor: Actor | None = Field(default=None, description="who; by default the signed-in name")


class RevokeRequest(_Body):
    reason: Reason = ""


class ForceRequest(CommandRequest):
    state: Name


class BudgetRequest(_Body):
    tokens: Annotated[int, Field(ge=0, le=most(machines.c.budget_tokens))] | None = None
    cost: Annotated[float, Field(ge=0, allow_inf_nan=False)] | None = None
    actor: Actor | None = None
    reason: Reason = ""


class DecisionRequest(_Body):
    decision: Literal["approve", "reject"]
    fields: dict[str, Any] = Field(default_factory=dict, description="the gate's form, filled in")
    comment: Reason = ""
    attempt: Annotated[int, Field(ge=1, le=STEP_MOST)] | None = Field(
        default=None, description="the gate's visit decided on; another visit's refuses it"
    )
    actor: Actor | None = Field(
        default=None,
        description="refused unless it is the signed-in identity's own name: a decision is "
        "recorded as who signed in (an admin's as an override)",
    )


class EventRequest(_Body):
    """An outside event; its sender is who authenticated it (the admin, or signed:TYPE), never a
    field of the body."""

    payload: dict[str, Any] = Field(
        default_factory=dict, description="matched to the state's schema"
    )
    key: Annotated[str, Field(min_length=1, max_length=most(machine_events.c.key))] | None = Field(
        default=None, description="the sender's id for the event: sent again, it is one event"
    )


class RewindRequest(_Body):
    step: Annotated[int, Field(ge=0, le=STEP_MOST)]
    set: dict[str, Any] = Field(default_factory=dict, description="edits over that step's context")
    reason: Reason = ""
    actor: Actor | None = Field(default=None, description="who; by default the signed-in name")


class FilterBody(_Body):
    status: MachineStatus | None = None
    type: MachineType | None = None
    agent_type: Annotated[str, Field(max_length=AGENT_TYPE_CHARS)] | None = None
    agent_id: UUID | None = None
    github_issue: Issue | None = None
    parent: UUID | None = Field(default=None, description="the children of this machine")
    created_after: datetime | None = None
    created_before: datetime | None = None
    roots: bool = Field(default=False, description="only machines no fan-out started")

    def to_filter(self) -> MachineFilter:
        given = {STORE_NAMES.get(n, n): getattr(self, n) for n in type(self).model_fields}
        return MachineFilter(**given | {"status": self.status.value if self.status else None})


STORE_NAMES = {"type": "machine_type", "parent": "parent_id"}  # MachineFilter's, where they differ


class BulkRequest(_Body):
    action: Literal["pause", "resume", "cancel", "retry"]
    filter: FilterBody
    reason: Reason = ""
    actor: Actor | None = None
    limit: int = Field(default=100, ge=1, le=1000, description="the most machines acted on")


# A field the page's filter form sends empty filters nothing (as if it were not sent).
BLANK = BeforeValidator(lambda value: None if value == "" else value)


def machine_filter(
    status: Annotated[MachineStatus | None, BLANK] = None,
    type: Annotated[str | None, Query(max_length=TYPE_CHARS)] = None,
    agent_type: Annotated[str | None, Query(max_length=AGENT_TYPE_CHARS)] = None,
    agent_id: UUID | None = None,
    github_issue: Annotated[int | None, BLANK] = None,  # bounded by FilterBody
    parent: Annotated[UUID | None, Query(description="the children of this machine")] = None,
    created_after: datetime | None = None,
    created_before: datetime | None = None,
    roots: Annotated[bool, Query(description="only machines no fan-out started")] = False,
) -> MachineFilter:
    """The list's filters, from the query string (an empty one filters nothing, as a page's
    form sends it)."""
    given = dict(locals())  # the query's filters are the body's fields, by the same names
    try:
        where = FilterBody(**given | {"type": type or None, "agent_type": agent_type or None})
    except ValidationError as exc:  # raised here, it would be a 500: it is the query's fault
        raise RequestValidationError(
            [{**e, "loc": ("query", *e["loc"])} for e in exc.errors()]
        ) from exc
    return where.to_filter()
