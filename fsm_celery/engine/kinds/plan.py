"""A fan-out's plan, made before anything of it is written: each child's definition, version
and starting context (a map's items, what its children share), bounded by FSM_MAX_CHILD_DEPTH,
FSM_MAX_FANOUT_ITEMS, FSM_MAX_FANOUT_BYTES and the children's context schemas."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import jmespath.exceptions
from sqlalchemy import Connection

from fsm_celery.core import inputs
from fsm_celery.core.context import context_problem
from fsm_celery.core.definition import Body, MachineDefinition, StateDefinition, compile_guard
from fsm_celery.core.transition import LOOP_COUNT, LOOP_LIMIT
from fsm_celery.engine.runtime import Runtime
from fsm_celery.exceptions import InvalidChildInput, UnknownMachineType
from fsm_celery.store import queries as q

Branches = list[tuple[str | None, MachineDefinition, int]]  # per branch: name, kind, version


class Refused(Exception):
    """A fan-out that cannot start: what its state says does not fit its context."""


class TooLarge(Refused):
    """A fan-out whose children's starting contexts together are past FSM_MAX_FANOUT_BYTES."""


@dataclass(frozen=True)
class Plan:
    """What a fan-out starts: each child's definition, type, version and starting context
    (what a map's children share, stored once, and each one's own part)."""

    branches: Branches  # per branch (a map's one body): its name, definition and version
    inputs: list[dict[str, Any]]
    shared: dict[str, Any]


class Planner:
    def __init__(self, runtime: Runtime) -> None:
        self._rt = runtime

    def plan(
        self,
        conn: Connection,
        row: q.AnyRow,
        definition: MachineDefinition,
        state: StateDefinition,
        context: Mapping[str, Any],
    ) -> Plan:
        settings = self._rt.settings
        if row.depth + 1 > settings.max_child_depth:
            raise Refused(
                f"its children would nest {row.depth + 1} deep, past "
                f"FSM_MAX_CHILD_DEPTH={settings.max_child_depth}"
            )
        children = definition.children(state)
        kinds = {
            branch: self.definition(conn, row, definition, state, branch, body)
            for branch, body in children
        }
        if state.map is None:
            inputs = [
                self._input(body, context, index, branch, kinds[branch][0])
                for index, (branch, body) in enumerate(children)
            ]
            _within(settings.max_fanout_bytes, [_size(built) for built in inputs])
            return Plan([(branch, *kinds[branch]) for branch, _ in children], inputs, {})
        items = _items(state, context, settings.max_fanout_items)
        ((_, body),) = children
        shared, own = self._map_inputs(state, body, context, items)
        child = kinds[None][0]
        if child.context_schema is not None:  # checked once every size is known to fit
            for index, part in enumerate(own):
                _check_schema(child, {**shared, **part}, f"item {index}")
        return Plan([(None, *kinds[None])], own, shared)

    def definition(
        self,
        conn: Connection,
        row: q.AnyRow,
        definition: MachineDefinition,
        state: StateDefinition,
        branch: str | None,
        body: Body,
    ) -> tuple[MachineDefinition, int]:
        """A child's definition and version: another type's newest, or the parent's own inline
        states (in the parent's version: they are part of it)."""
        if body.machine is None:
            return definition.inline(state.name, branch), row.definition_version
        try:
            version, found = self._rt.catalog.latest(conn, body.machine)
        except UnknownMachineType as exc:
            raise Refused(f"machine {body.machine!r} is not a loaded definition") from exc
        return found, version

    def _input(
        self,
        body: Body,
        context: Mapping[str, Any],
        index: int,
        branch: str | None,
        child: MachineDefinition,
    ) -> dict[str, Any]:
        """A branch's or child machine's starting context: its input from the parent's
        context (and its position, as `index`), checked as a machine's start would be."""
        data = {"context": context, "item": None, "index": index}
        where = f"branch {branch}" if branch else "input"
        try:
            built = _evaluate(body.input, data, default=True, context=context)
        except Refused as exc:
            raise Refused(f"{where}: {exc}") from None
        self._fits(where, _size(built))
        _check_schema(child, built, where)
        return built

    def _map_inputs(
        self, state: StateDefinition, body: Body, context: Mapping[str, Any], items: list[Any]
    ) -> tuple[dict[str, Any], list[dict[str, Any]]]:
        """A map's input: what its children share, rendered once, and each item's own part
        (its item under its item_key); each child's context and all of them together bounded
        before anything is written."""
        assert state.map is not None
        own: list[dict[str, Any]] = []
        try:
            parts = inputs.split(body.input)
            shared = inputs.shared_part(parts, context)
            for index, item in enumerate(items):
                data = {"context": context, "item": item, "index": index}
                own.append(inputs.own_part(parts, data) | {state.map.item_key: item})
        except InvalidChildInput as exc:
            raise Refused(f"item {len(own)}: {exc.detail}") from None
        shared_size = _size(shared)
        sizes = [inputs.joined_size(shared_size, _size(part)) for part in own]
        for index, size in enumerate(sizes):
            self._fits(f"item {index}", size)
        _within(self._rt.settings.max_fanout_bytes, sizes)
        return shared, own

    def _fits(self, where: str, size: int) -> None:
        most = self._rt.settings.max_context_bytes
        if size > most:
            raise Refused(
                f"{where}: the child's context would be {size} bytes, over the limit of {most}"
            )

    def branches(
        self,
        conn: Connection,
        parent: q.AnyRow,
        definition: MachineDefinition,
        state: StateDefinition,
    ) -> Branches:
        """A map's one body, for the items started later (every slot runs the same)."""
        ((branch, body),) = definition.children(state)
        return [(branch, *self.definition(conn, parent, definition, state, branch, body))]


def _items(state: StateDefinition, context: Mapping[str, Any], most: int) -> list[Any]:
    """A map's list, from its parent's context, bounded."""
    assert state.map is not None
    expression = state.map.items
    try:
        items = compile_guard(expression).search({"context": context})
    except jmespath.exceptions.JMESPathError as exc:
        raise Refused(f"items {expression!r} failed: {exc}") from None
    if not isinstance(items, list):
        found = "nothing" if items is None else type(items).__name__
        raise Refused(f"items {expression!r} is not a list (got {found})")
    if len(items) > most:
        raise Refused(
            f"items {expression!r} holds {len(items)} items, over FSM_MAX_FANOUT_ITEMS={most}"
        )
    return items


def _evaluate(
    spec: str | dict[str, str] | None,
    data: Mapping[str, Any],
    *,
    default: bool,
    context: Mapping[str, Any],
) -> dict[str, Any]:
    """A child's input: its expression's object, one expression per key, or by default the
    parent's context (a map's child sees only its item unless its input says more)."""
    if spec is None:
        if not default:
            return {}
        return {k: v for k, v in context.items() if k not in (LOOP_COUNT, LOOP_LIMIT)}
    try:
        if isinstance(spec, str):
            built = compile_guard(spec).search(data)
            if not isinstance(built, dict):
                found = "nothing" if built is None else type(built).__name__
                raise Refused(f"{spec!r} must give an object, got {found}")
            return dict(built)
        return {key: compile_guard(expr).search(data) for key, expr in spec.items()}
    except jmespath.exceptions.JMESPathError as exc:
        raise Refused(f"{exc}") from None


def _size(built: Mapping[str, Any]) -> int:
    return len(json.dumps(built))


def _within(most: int, sizes: Sequence[int]) -> None:
    """Refuse a fan-out whose children's starting contexts would take more than `most` bytes
    together (each child's row holds its own; all of them are what one answer plans)."""
    total = sum(sizes)
    if total > most:
        raise TooLarge(
            f"its {len(sizes)} children's starting contexts would take {total} bytes together, "
            f"over FSM_MAX_FANOUT_BYTES={most}"
        )


def _check_schema(child: MachineDefinition, built: Mapping[str, Any], where: str) -> None:
    if child.context_schema is None:
        return
    mismatch = context_problem(child.context_schema, built)
    if mismatch is not None:
        raise Refused(f"{where}: the input does not match {child.type}'s schema: {mismatch}")
