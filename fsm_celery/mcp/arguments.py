"""What the operator door's tools take, each bounded to what the store holds or a page shows:
a bad argument is refused by the tool's input schema, naming it, before anything is read or
written."""

from __future__ import annotations

import json
from typing import Annotated, Any

from pydantic import AfterValidator, Field

from fsm_celery.core.messages import unstorable
from fsm_celery.core.signal import EVENT_PATTERN, MAX_PAYLOAD_BYTES
from fsm_celery.core.start_key import KEY_CHARS
from fsm_celery.store.rows import most
from fsm_celery.store.tables import definitions, machine_events, machines, transitions

PAGE_MOST = 500  # items on one page at the most, as the HTTP API's lists
DEFINITION_TEXT_CHARS = 200_000  # a definition's YAML given to replay
STEP_MOST = most(transitions.c.attempt)


def _storable(value: dict[str, Any]) -> dict[str, Any]:
    """A JSON object PostgreSQL can store, of at most MAX_PAYLOAD_BYTES as JSON."""
    problem = unstorable(value, "value")
    if problem is not None:
        raise ValueError(problem)
    try:
        size = len(json.dumps(value, ensure_ascii=False).encode())
    except (TypeError, ValueError, UnicodeEncodeError, RecursionError) as exc:
        raise ValueError(f"not storable JSON: {exc}") from None
    if size > MAX_PAYLOAD_BYTES:
        raise ValueError(f"{size} bytes as JSON: at most {MAX_PAYLOAD_BYTES}")
    return value


MachineId = Annotated[
    str,
    Field(
        min_length=4,
        max_length=36,
        pattern=r"^[0-9a-fA-F-]+$",
        description="a machine's id, or the start of it (4 hex digits or more)",
    ),
]
JsonObject = Annotated[dict[str, Any], AfterValidator(_storable)]
Limit = Annotated[int, Field(ge=1, le=PAGE_MOST, description="items on the page")]
Cursor = Annotated[str | None, Field(max_length=200, description="the `next` a previous page gave")]
Step = Annotated[int, Field(ge=0, le=STEP_MOST, description="a step of the machine's history")]
After = Annotated[int, Field(ge=-1, le=STEP_MOST, description="the steps after this one")]
Version = Annotated[int | None, Field(ge=1, le=most(definitions.c.version))]
Reason = Annotated[str, Field(max_length=2000, description="why, kept in the history")]
MachineType = Annotated[str, Field(min_length=1, max_length=most(machines.c.type))]
TypeFilter = Annotated[str | None, Field(max_length=most(machines.c.type))]
AgentType = Annotated[str | None, Field(max_length=most(machines.c.agent_type))]
StateName = Annotated[str, Field(min_length=1, max_length=most(machines.c.current_state))]
EventName = Annotated[
    str, Field(min_length=1, max_length=most(machine_events.c.name), pattern=EVENT_PATTERN)
]
EventKey = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=most(machine_events.c.key),
        description="the sender's id for the event: sent again, it is one event",
    ),
]
Issue = Annotated[int | None, Field(ge=0, le=most(machines.c.github_issue))]
StartKey = Annotated[
    str | None,
    Field(
        min_length=1,
        max_length=KEY_CHARS,
        description="the start's idempotency key: started again with it, the same machine",
    ),
]
DefinitionText = Annotated[
    str | None,
    Field(min_length=1, max_length=DEFINITION_TEXT_CHARS, description="a definition's YAML"),
]
Tokens = Annotated[int | None, Field(ge=0, le=most(machines.c.budget_tokens))]
Cost = Annotated[float | None, Field(ge=0, allow_inf_nan=False)]
