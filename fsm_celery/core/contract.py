"""Output contracts: the JSON Schema (2020-12) an agent's answer must match, and the problems of
an answer that does not, each named by its JSON pointer. Bounded: the problems go back to the
agent over Redis and into the history, and an answer is untrusted."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from itertools import islice
from typing import TYPE_CHECKING, Any

from jsonschema import Draft202012Validator
from jsonschema.exceptions import SchemaError

if TYPE_CHECKING:
    from fsm_celery.core.definition import StateDefinition

MAX_PROBLEMS = 20  # an answer's problems named; the rest are counted, not listed
MESSAGE_CHARS = 300  # of each problem's message
POINTER_CHARS = 200  # of each problem's pointer
SUMMARY_CHARS = 2000  # of the problems as one line (an error message)


@dataclass(frozen=True)
class Flaw:
    """One way an answer breaks its contract: where (a JSON pointer into the output) and why."""

    pointer: str
    message: str

    def to_json(self) -> dict[str, str]:
        return {"pointer": self.pointer, "message": self.message}


def schema_of(output_schema: Mapping[str, Any] | None, required: Sequence[str]) -> dict[str, Any]:
    """A state's contract as one schema: its output_schema with its required_output (the short
    form: an object with those keys) merged in; {} when it declares neither (anything goes)."""
    if output_schema is None and not required:
        return {}
    schema = dict(output_schema or {"type": "object"})
    if required:
        given = schema.get("required")
        known = list(given) if isinstance(given, list) else []
        schema["required"] = known + [key for key in required if key not in known]
    return schema


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why a schema is not a valid JSON Schema 2020-12, in one line, or None."""
    try:
        Draft202012Validator.check_schema(schema)
    except SchemaError as exc:
        where = _pointer(exc.absolute_path)
        return f"not a valid JSON Schema 2020-12 at {where or '/'}: {_cut(exc.message)}"
    return None


def flaws(schema: Mapping[str, Any], output: Mapping[str, Any]) -> tuple[Flaw, ...]:
    """The answer's problems against the schema (at most MAX_PROBLEMS), in the order the
    validator finds them; () when it holds to it. The schema was checked when it loaded."""
    if not schema:
        return ()
    validator = _validator(json.dumps(schema, sort_keys=True))
    found = islice(validator.iter_errors(output), MAX_PROBLEMS)
    return tuple(Flaw(_pointer(e.absolute_path)[:POINTER_CHARS], _cut(e.message)) for e in found)


def state_flaws(state: StateDefinition, output: Mapping[str, Any]) -> tuple[Flaw, ...]:
    """The output's problems against the state's contract (the short form alone, on every
    ack of most states, checked without a validator)."""
    if state.output_schema is None:
        missing = [key for key in state.required_output if key not in output]
        return tuple(Flaw("", f"{key!r} is a required property") for key in missing[:MAX_PROBLEMS])
    return flaws(schema_of(state.output_schema, state.required_output), output)


def contract_error(state: StateDefinition, output: Mapping[str, Any]) -> str | None:
    """How the output breaks the state's contract, in one line, or None."""
    found = state_flaws(state, output)
    return "the output breaks its contract: " + summary(found) if found else None


def summary(found: Iterable[Flaw]) -> str:
    """The problems as one line (an error message, a history row's), bounded."""
    text = "; ".join(f"{f.pointer or '/'}: {f.message}" for f in found)
    return text if len(text) <= SUMMARY_CHARS else text[: SUMMARY_CHARS - 1] + "…"


@lru_cache(maxsize=1024)
def _validator(schema: str) -> Draft202012Validator:
    return Draft202012Validator(json.loads(schema))


def _pointer(path: Iterable[Any]) -> str:
    """RFC 6901: each step after a '/', with '~' and '/' escaped."""
    return "".join("/" + str(p).replace("~", "~0").replace("/", "~1") for p in path)


def _cut(message: str) -> str:
    return message if len(message) <= MESSAGE_CHARS else message[: MESSAGE_CHARS - 1] + "…"
