"""A machine's context through its history, pure: a change turns one context into the next,
and folding a run's changes gives the context after every step."""

from __future__ import annotations

import itertools
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from fsm_celery.core import timeline

VALUES = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
CONTEXTS = st.dictionaries(st.text(max_size=4), VALUES, max_size=8)


@settings(max_examples=300, deadline=None)
@given(before=CONTEXTS, after=CONTEXTS)
def test_a_change_turns_the_context_before_into_the_one_after(
    before: dict[str, Any], after: dict[str, Any]
) -> None:
    delta = timeline.change(before, after)
    assert timeline.same(timeline.apply(before, delta), after)
    assert (delta is None) == timeline.same(before, after)


@settings(max_examples=100, deadline=None)
@given(steps=st.lists(CONTEXTS, min_size=1, max_size=12))
def test_folding_a_runs_changes_gives_every_steps_context(steps: list[dict[str, Any]]) -> None:
    deltas = [timeline.started(steps[0])]
    deltas += [timeline.change(a, b) for a, b in itertools.pairwise(steps)]
    found = timeline.contexts(deltas)
    assert all(timeline.same(a, b) for a, b in zip(found, steps, strict=True))


def test_a_change_names_only_what_changed() -> None:
    before = {"a": 1, "b": [1, 2], "c": "x", "gone": True}
    after = {"a": 1, "b": [1, 2, 3], "c": "x", "new": None, "one": 1.0}
    assert timeline.change(before, after) == {
        "set": {"b": [1, 2, 3], "new": None, "one": 1.0},
        "unset": ["gone"],
    }
    assert timeline.change({"n": 1}, {"n": True}) == {"set": {"n": True}}  # 1 == True, not same
    assert timeline.change(after, dict(after)) is None
    assert timeline.change({"l": [1]}, {"l": [True]}) == {"set": {"l": [True]}}
