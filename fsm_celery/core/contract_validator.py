"""The contract checks of a definition: each state's output_schema is a valid JSON Schema, and
its guards read only what the schema declares, compared with values of the types it declares
(a guard `output.passed == 'yes'` on a boolean `passed` would never hold). The guards are read
as JMESPath's parser gives them (an AST), not as text."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jmespath.exceptions

from fsm_celery.core.contract import schema_of, schema_problem
from fsm_celery.core.definition import StateDefinition, compile_guard
from fsm_celery.exceptions import Problem

Node = Mapping[str, Any]
_JSON_TYPES = {bool: "boolean", str: "string", int: "integer", float: "number", type(None): "null"}
_COMPARED = ("eq", "ne", "lt", "lte", "gt", "gte")


def contract_problems(state: StateDefinition, source: str) -> Iterator[Problem]:
    """What is wrong with the state's contract, and with its guards against it."""
    if state.output_schema is not None:
        problem = schema_problem(state.output_schema)
        if problem is not None:
            yield Problem(f"output_schema is {problem}", source, state.name, "output_schema")
            return
    schema = schema_of(state.output_schema, state.required_output)
    properties = schema.get("properties")
    if not isinstance(properties, Mapping):
        return  # it declares no fields: a guard may read any
    for edge in state.on_success:
        if edge.when is None:
            continue
        for why in guard_problems(edge.when, properties):
            message = f"guard {edge.when!r} of state {state.name}: {why}"
            yield Problem(message, source, state.name, "on_success")


def guard_problems(when: str, properties: Mapping[str, Any]) -> Iterator[str]:
    """How the guard breaks the contract whose fields are `properties` (a guard that does not
    compile is another check's)."""
    try:
        tree = compile_guard(when).parsed
    except jmespath.exceptions.JMESPathError:
        return
    declared = ", ".join(sorted(properties)) or "none"
    for node in _walk(tree):
        field = _output_field(node)
        if field is not None and field not in properties:
            yield f"reads output.{field}, which the output_schema does not declare ({declared})"
        if node.get("type") == "comparator" and node.get("value") in _COMPARED:
            yield from _mismatch(node, properties)


def _walk(node: Node) -> Iterator[Node]:
    stack = [node]
    while stack:
        current = stack.pop()
        yield current
        stack.extend(c for c in current.get("children", ()) if isinstance(c, Mapping))


def _output_field(node: Node) -> str | None:
    """The output's field a `output.x...` expression reads first, or None."""
    if node.get("type") != "subexpression":
        return None
    children = node.get("children", [])
    if len(children) < 2 or not all(c.get("type") == "field" for c in children[:2]):
        return None
    return str(children[1]["value"]) if children[0]["value"] == "output" else None


def _mismatch(node: Node, properties: Mapping[str, Any]) -> Iterator[str]:
    """A comparison of an output field with a literal of a type its schema does not allow."""
    left, right = node["children"][0], node["children"][1]
    for side, other in ((left, right), (right, left)):
        field = _output_field(side)
        if field is None or other.get("type") != "literal" or field not in properties:
            continue
        allowed = _types(properties[field])
        given = _JSON_TYPES.get(type(other["value"]))
        if given is None or not allowed or given in allowed:
            continue
        if given == "integer" and "number" in allowed:
            continue
        if given == "number" and "integer" in allowed and float(other["value"]).is_integer():
            continue
        yield (
            f"compares output.{field} ({' or '.join(sorted(allowed))}) with "
            f"{given} {other['value']!r}: it can never be equal"
            if node["value"] in ("eq", "ne")
            else f"compares output.{field} ({' or '.join(sorted(allowed))}) with {given} "
            f"{other['value']!r}"
        )


def _types(schema: Any) -> set[str]:
    """The JSON types a property's schema allows ({}: it does not say)."""
    if not isinstance(schema, Mapping):
        return set()
    kind = schema.get("type")
    if isinstance(kind, str):
        return {kind}
    if isinstance(kind, list):
        return {k for k in kind if isinstance(k, str)}
    return set()
