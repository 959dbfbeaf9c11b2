"""A machine's context through its history, reconstructed from what each history row records:
the change its transition made to the context (`context_delta`), not a snapshot per step (a
snapshot per step grows storage with the square of a run's length). Pure.

A change is `{"set": {key: value, ...}, "unset": [key, ...]}`, either part left out when empty
(`{}`: the step changed nothing; a row with none was recorded before the history kept them);
the start row's sets the machine's starting context. Folding the changes in attempt order gives
the context after each step.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

MISSING = object()
# who a history row names as its actor (state_transitions.actor; the audit keeps as many): a
# person, an approver, an event's sender, a schedule's trigger
ACTOR_CHARS = 100


def change(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, Any] | None:
    """What turned `before` into `after`: the keys set (new or changed) and unset; None when
    nothing changed."""
    set_ = {
        k: v for k, v in after.items() if before.get(k, MISSING) is not v and _differs(before, k, v)
    }
    unset = [k for k in before if k not in after]
    found: dict[str, Any] = {}
    if set_:
        found["set"] = set_
    if unset:
        found["unset"] = unset
    return found or None


def _differs(before: Mapping[str, Any], key: str, value: Any) -> bool:
    had = before.get(key, MISSING)
    return had is MISSING or not same(had, value)


def same(a: Any, b: Any) -> bool:
    """Equal as JSON: Python's == holds 1 == 1.0 == True and [1] == [True], which JSON tells
    apart."""
    if a is b:
        return True
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(same(v, b[k]) for k, v in a.items())
    if isinstance(a, list | tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return bool(a == b)


def started(context: Mapping[str, Any]) -> dict[str, Any]:
    """The start row's change: every key of the starting context set."""
    return {"set": dict(context)}


def apply(context: Mapping[str, Any], delta: Mapping[str, Any] | None) -> dict[str, Any]:
    """The context after a change."""
    after = dict(context)
    if not delta:
        return after
    for key in delta.get("unset", ()):
        after.pop(key, None)
    after.update(delta.get("set", {}))
    return after


def contexts(deltas: Iterable[Mapping[str, Any] | None]) -> list[dict[str, Any]]:
    """The context after each step, from the steps' changes in attempt order (the start's
    first)."""
    found: list[dict[str, Any]] = []
    context: dict[str, Any] = {}
    for delta in deltas:
        context = apply(context, delta)
        found.append(context)
    return found


def context_at(deltas: Iterable[Mapping[str, Any] | None]) -> dict[str, Any] | None:
    """The context after the last of the changes (one dict, changed in place), or None when a
    change is missing (a row recorded before the history kept them)."""
    context: dict[str, Any] = {}
    for delta in deltas:
        if delta is None:
            return None
        for key in delta.get("unset", ()):
            context.pop(key, None)
        context.update(delta.get("set", {}))
    return context
