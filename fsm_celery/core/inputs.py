"""A map's `input`, split into what every child shares and what is each item's own. Pure.

A map's children see `{context, item, index}`; what of their input reads only `context` is
the same for every item, so it is rendered once and stored once, on the fan-out (a 400 KB
`query` copied into 1,000 slots was 400 MB in one transaction), and each slot keeps only its
own part. The split is decided from the expression's syntax, conservatively: a part is shared
only when every value it reads from the root is under `context`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import jmespath
from jmespath.parser import ParsedResult

from fsm_celery.exceptions import InvalidChildInput

ROOT = "context"  # the one root field that is the same for every item
# nodes whose first child is read from where they are, the others from its results
_CHAINS = frozenset(
    {
        "subexpression",
        "index_expression",
        "pipe",
        "projection",
        "value_projection",
        "filter_projection",
        "flatten",
    }
)
# nodes whose every child is read from where they are
_ALL = frozenset(
    {
        "multi_select_dict",
        "multi_select_list",
        "key_val_pair",
        "or_expression",
        "and_expression",
        "not_expression",
        "comparator",
        "function_expression",
    }
)


def reads_item(node: Mapping[str, Any]) -> bool:
    """Whether a parsed expression, evaluated at the root, may read more than `context`."""
    kind = node["type"]
    children = node.get("children", [])
    if kind == "field":
        return bool(node["value"] != ROOT)
    if kind in ("literal", "expref"):  # an expref is applied to a function's arguments
        return False
    if kind in _CHAINS:
        return reads_item(children[0])
    if kind in _ALL:
        return any(reads_item(child) for child in children)
    return True  # current, identity, a bare index or slice, and anything new: the root


@dataclass(frozen=True)
class Split:
    """An input's parts: one expression for the whole object, or one per key; each either
    shared by every item or evaluated per item."""

    shared: dict[str, ParsedResult] = field(default_factory=dict)
    own: dict[str, ParsedResult] = field(default_factory=dict)
    whole: ParsedResult | None = None  # an expression giving the whole object
    whole_shared: bool = False


def split(spec: str | Mapping[str, str] | None) -> Split:
    """Split a map's input expression (a string, or one per key) into its shared and own
    parts."""
    if spec is None:
        return Split()
    if isinstance(spec, str):
        parsed = jmespath.compile(spec)
        tree = parsed.parsed
        if tree["type"] != "multi_select_dict":
            return Split(whole=parsed, whole_shared=not reads_item(tree))
        pairs = {pair["value"]: pair["children"][0] for pair in tree["children"]}
    else:
        pairs = {key: jmespath.compile(expr).parsed for key, expr in spec.items()}
    shared: dict[str, ParsedResult] = {}
    own: dict[str, ParsedResult] = {}
    for key, node in pairs.items():
        (own if reads_item(node) else shared)[key] = ParsedResult(key, node)
    return Split(shared, own)


def shared_part(parts: Split, context: Mapping[str, Any]) -> dict[str, Any]:
    """What every child of the map starts with, rendered once."""
    data = {ROOT: context}
    if parts.whole is not None:
        return _object(parts.whole, data) if parts.whole_shared else {}
    return _evaluated(parts.shared, data)


def own_part(parts: Split, data: Mapping[str, Any]) -> dict[str, Any]:
    """What one item's child starts with besides the shared part (its item not included)."""
    if parts.whole is not None:
        return {} if parts.whole_shared else _object(parts.whole, data)
    return _evaluated(parts.own, data)


def joined_size(shared: int, own: int) -> int:
    """The JSON size of two objects' keys in one object, from their sizes (`{}` is 2)."""
    if shared <= 2 or own <= 2:
        return max(shared, own)
    return shared + own  # "{a}" + "{b}" -> "{a, b}": the same length


def _object(parsed: ParsedResult, data: Mapping[str, Any]) -> dict[str, Any]:
    found = _search(parsed, data)
    if not isinstance(found, dict):
        got = "nothing" if found is None else type(found).__name__
        raise InvalidChildInput(f"{parsed.expression!r} must give an object, got {got}")
    return dict(found)


def _evaluated(parts: Mapping[str, ParsedResult], data: Mapping[str, Any]) -> dict[str, Any]:
    return {key: _search(parsed, data) for key, parsed in parts.items()}


def _search(parsed: ParsedResult, data: Mapping[str, Any]) -> Any:
    try:
        return parsed.search(data)
    except jmespath.exceptions.JMESPathError as exc:
        raise InvalidChildInput(str(exc)) from None
