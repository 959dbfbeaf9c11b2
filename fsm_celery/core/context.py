"""A definition's context_schema: the JSON Schema a machine's starting context must match. Pure.

A definition says what its prompts need before any agent has answered (a project's name, a
research query); `start` refuses a context that does not say it, through every entry point,
with one line naming the field, instead of a machine whose first prompt cannot render. The
schema is checked when the definition loads; references are resolved within the schema only
(nothing is fetched).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions
import jsonschema.protocols
import referencing
import referencing.exceptions
from jsonschema.validators import validator_for
from referencing.jsonschema import DRAFT202012, UnknownDialect, specification_with

DETAIL_CHARS = 200  # a refusal is one line, whatever value the caller sent
REFERENCES = ("$ref", "$dynamicRef")
OPEN_KEYWORDS = ("additionalProperties", "unevaluatedProperties", "propertyNames")


def schema_problem(schema: Mapping[str, Any]) -> str | None:
    """Why the schema cannot check a starting context, or None when it can."""
    problem = _dialect_problem(schema.get("$schema"))
    if problem is not None:
        return problem
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    try:
        cls.check_schema(dict(schema))
    except jsonschema.exceptions.SchemaError as exc:
        return f"not a valid JSON Schema at {_pointer(exc.absolute_path)}: {_line(exc.message)}"
    if schema.get("type", "object") != "object":
        return f"a context is a JSON object: the type must be object, not {schema['type']!r}"
    return _reference_problem(schema)


def _dialect_problem(dialect: Any) -> str | None:
    if dialect is None:
        return None
    try:
        if isinstance(dialect, str):
            specification_with(dialect)
            return None
    except UnknownDialect:
        pass
    return f"$schema {dialect!r} is not a JSON Schema dialect (leave it out for Draft 2020-12)"


def _reference_problem(schema: Mapping[str, Any]) -> str | None:
    """A reference that would be fetched, or that points at nothing within the schema."""
    resource = specification_with(schema.get("$schema", ""), default=DRAFT202012).create_resource(
        schema
    )
    uri = resource.id() or ""
    resolver = referencing.Registry().with_resource(uri, resource).resolver(base_uri=uri)
    for ref in _references(schema):
        if not ref.startswith("#"):
            return f"{ref!r} is not a reference within the schema (#/...): nothing is fetched"
        try:
            resolver.lookup(ref)
        except referencing.exceptions.Unresolvable:
            return f"the reference {ref!r} points at nothing in the schema"
    return None


def context_problem(schema: Mapping[str, Any], context: Mapping[str, Any]) -> str | None:
    """Why the context does not match the schema, in one line naming the field; None if it does."""
    validator = _validator(schema)
    try:
        error = jsonschema.exceptions.best_match(validator.iter_errors(dict(context)))
    except referencing.exceptions.Unresolvable as exc:  # the loader refuses these; still one line
        return f"the schema's reference {exc.ref!r} does not resolve"
    if error is None:
        return None
    where = f"at {_pointer(error.absolute_path)}: " if error.absolute_path else ""
    return where + _line(error.message)


def edited_problem(schema: Mapping[str, Any], context: Mapping[str, Any]) -> str | None:
    """Why a context an operator edited (a rewind's, a fork's) does not match the schema, or
    None: the whole context is checked, but keys the schema does not declare are allowed (a
    running machine's context holds its agents' outputs beside what it started with)."""
    relaxed = {k: v for k, v in schema.items() if k not in OPEN_KEYWORDS}
    return context_problem(relaxed, context)


def _validator(schema: Mapping[str, Any]) -> jsonschema.protocols.Validator:
    cls = validator_for(schema, default=jsonschema.Draft202012Validator)
    registry: referencing.Registry[Any] = referencing.Registry()
    return cls(schema, registry=registry)


def _pointer(path: Any) -> str:
    """A JSON Pointer (RFC 6901) to the field: /taskState/query."""
    parts = [str(p).replace("~", "~0").replace("/", "~1") for p in path]
    return "/" + "/".join(parts) if parts else "/"


def _line(message: str) -> str:
    one = " ".join(message.split())
    return one if len(one) <= DETAIL_CHARS else one[: DETAIL_CHARS - 1] + "…"


def _references(node: Any) -> Iterator[str]:
    if isinstance(node, Mapping):
        for key, value in node.items():
            if key in REFERENCES and isinstance(value, str):
                yield value
            else:
                yield from _references(value)
    elif isinstance(node, list):
        for item in node:
            yield from _references(item)
