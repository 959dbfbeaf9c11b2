"""A map's input split into what its children share and each item's own part (core/inputs.py),
and children's spending rolled up without passing a machine's bounds (core/usage.py)."""

from __future__ import annotations

import json
import re

import jmespath
import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsm_celery.core import inputs
from fsm_celery.core.usage import MAX_COST, MAX_TOKENS, Usage
from fsm_celery.exceptions import InvalidChildInput

GOT = "'context.query' must give an object, got str"
CONTEXT = {"query": "q", "cfg": {"a": 1}, "items": [1, 2]}


@pytest.mark.parametrize(
    ("expression", "reads"),
    [
        ("context.query", False),
        ("context.items[0]", False),
        ("context.items[*].x", False),
        ("length(context.items)", False),
        ("sort_by(context.items, &x)", False),
        ("`3`", False),
        ("item", True),
        ("index", True),
        ("@", True),
        ("[0]", True),
        ("*", True),
        ("context.query || item", True),
        ("keys(@)", True),
        ("merge(context.cfg, {i: item})", True),
        ("context.items[?@ == item]", False),  # the filter reads each element, not the root
    ],
)
def test_only_what_reads_nothing_but_the_context_is_shared(expression: str, reads: bool) -> None:
    assert inputs.reads_item(jmespath.compile(expression).parsed) is reads


def test_a_keyed_input_is_split_key_by_key() -> None:
    parts = inputs.split("{query: context.query, q: item, n: index, cfg: context.cfg}")
    assert inputs.shared_part(parts, CONTEXT) == {"query": "q", "cfg": {"a": 1}}
    data = {"context": CONTEXT, "item": "x", "index": 4}
    assert inputs.own_part(parts, data) == {"q": "x", "n": 4}


def test_one_expression_per_key_is_split_the_same_way() -> None:
    parts = inputs.split({"query": "context.query", "q": "item"})
    assert inputs.shared_part(parts, CONTEXT) == {"query": "q"}
    assert inputs.own_part(parts, {"context": CONTEXT, "item": 1, "index": 0}) == {"q": 1}


def test_a_whole_object_is_shared_or_own_as_a_whole() -> None:
    shared = inputs.split("context.cfg")
    assert inputs.shared_part(shared, CONTEXT) == {"a": 1}
    assert inputs.own_part(shared, {"context": CONTEXT, "item": 1, "index": 0}) == {}
    own = inputs.split("merge(context.cfg, {i: item})")
    assert inputs.shared_part(own, CONTEXT) == {}
    data = {"context": CONTEXT, "item": 7, "index": 0}
    assert inputs.own_part(own, data) == {"a": 1, "i": 7}


def test_a_whole_expression_that_gives_no_object_is_refused_by_name() -> None:
    with pytest.raises(InvalidChildInput, match=re.escape(GOT)):
        inputs.shared_part(inputs.split("context.query"), CONTEXT)


json_objects = st.dictionaries(
    st.text(max_size=5), st.one_of(st.integers(), st.text(max_size=20)), max_size=4
)


@given(json_objects, json_objects)
def test_the_joined_size_is_the_size_of_the_joined_object(
    shared: dict[str, object], own: dict[str, object]
) -> None:
    own = {f"own{key}": value for key, value in own.items()}  # the parts never share a key
    size = inputs.joined_size(len(json.dumps(shared)), len(json.dumps(own)))
    assert size == len(json.dumps({**shared, **own}))


def test_rolled_up_spending_saturates_at_a_machines_bounds() -> None:
    total = Usage()
    for _ in range(1100):
        total = total.rolled(Usage(MAX_TOKENS, MAX_COST))
    assert total == Usage(MAX_TOKENS, MAX_COST)
    assert Usage(5, 1.5).rolled(Usage(2, 0.25)) == Usage(7, 1.75)
    assert Usage(MAX_TOKENS + 9, 0.0).rolled(Usage(1, 0.0)).tokens == MAX_TOKENS + 9
