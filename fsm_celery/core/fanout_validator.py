"""The validator's checks of children: a fan-out state's kind, join, bodies and map, and
the tree of machine types that start each other."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping

from fsm_celery.core.definition import (
    AtLeast,
    Body,
    MachineDefinition,
    MapSpec,
    Parallel,
    StateDefinition,
    compile_problem,
)
from fsm_celery.exceptions import Problem

# The keys the engine keeps in every context: a fan-out may not write its results over them.
RESERVED_KEYS = ("retryCount", "maxRetries")


# The checks of a whole definition, which an inline body is checked with (the validator's own).
MachineProblems = Callable[[MachineDefinition, str], Iterator[Problem]]


def fanout_problems(
    d: MachineDefinition, state: StateDefinition, source: str, machine_problems: MachineProblems
) -> Iterator[Problem]:
    """What is wrong with a state's children: its kind, its join, its bodies (an inline one by
    machine_problems), its map."""
    kinds = [k for k in ("parallel", "map", "machine") if getattr(state, k) is not None]
    if not kinds:
        for field in ("input", "output", "on_parent_cancel"):
            if field in state.model_fields_set:
                yield Problem(
                    f"{field} applies to a state with children", source, state.name, field
                )
        return
    if len(kinds) > 1:
        kinds_text = " and ".join(kinds)
        yield Problem(f"a state has one kind of children, not {kinds_text}", source, state.name)
        return
    yield from _kind_problems(state, kinds[0], source)
    if state.parallel is not None:
        yield from _parallel_problems(d, state, state.parallel, source)
    if state.map is not None:
        yield from _map_problems(d, state, state.map, source)
    children = d.children(state)
    names = [branch for branch, _ in children]
    for branch, body in children:
        if names.count(branch) == 1:  # a duplicate branch, refused above, names no one body
            yield from _body_problems(d, state, branch, body, source, machine_problems)


def _kind_problems(state: StateDefinition, kind: str, source: str) -> Iterator[Problem]:
    name = state.name
    if state.terminal is not None:
        yield Problem(f"a terminal state starts no children ({kind})", source, name, kind)
    if state.prompt:
        yield Problem(
            f"a {kind} state has no prompt: its children do the work", source, name, "prompt"
        )
    if kind != "machine":
        for field in ("input", "output"):
            if field in state.model_fields_set:
                yield Problem(f"{field} goes on each of the {kind}'s bodies", source, name, field)


def _parallel_problems(
    d: MachineDefinition, state: StateDefinition, parallel: Parallel, source: str
) -> Iterator[Problem]:
    name = state.name
    names = [b.name for b in parallel.branches]
    for i, branch in enumerate(names):
        if branch in names[:i]:
            yield Problem(f"duplicate branch name {branch!r}", source, name, "parallel.branches")
        if branch in RESERVED_KEYS:
            yield Problem(
                f"branch {branch!r} would write its output over the engine's loop counter",
                source,
                name,
                "parallel.branches",
            )
    if isinstance(parallel.join, AtLeast) and parallel.join.at_least > len(names):
        yield Problem(
            f"join at_least: {parallel.join.at_least} is more than the {len(names)} branches",
            source,
            name,
            "parallel.join",
        )
    if parallel.tolerated_failures and parallel.join != "all":
        yield Problem(
            "tolerated_failures applies to join: all (any and at_least need fewer already)",
            source,
            name,
            "parallel.tolerated_failures",
        )
    if parallel.tolerated_failures >= len(names):
        yield Problem(
            f"tolerated_failures {parallel.tolerated_failures} tolerates every branch failing",
            source,
            name,
            "parallel.tolerated_failures",
        )


def _map_problems(
    d: MachineDefinition, state: StateDefinition, spec: MapSpec, source: str
) -> Iterator[Problem]:
    name = state.name
    problem = compile_problem(spec.items)
    if problem is not None:
        yield Problem(f"items {spec.items!r} {problem}", source, name, "map.items")
        return
    items = " ".join(spec.items.split())  # as one line, in a message (YAML may fold it)
    result_key = spec.result_key or name
    clash = _clash(d, items, result_key)
    if clash is not None:
        yield Problem(f"result_key {result_key!r} {clash}", source, name, "map.result_key")
    if spec.max_concurrency is None and _bound(d, items) is None:
        yield Problem(
            f"map over {items} needs max_concurrency: nothing bounds the list (set "
            "max_concurrency, or give its context_schema property a maxItems)",
            source,
            name,
            "map.max_concurrency",
        )


def _clash(d: MachineDefinition, items: str, key: str) -> str | None:
    """How a map's result_key would clash with the context, or None."""
    if key in RESERVED_KEYS:
        return "would write over the engine's loop counter"
    if items.strip() == f"context.{key}":
        return f"would write the results over the list they come from ({items})"
    declared = (d.context_schema or {}).get("properties", {})
    if isinstance(declared, dict) and key in declared:
        return "is a property of the context_schema: the results would write over it"
    return None


def _bound(d: MachineDefinition, items: str) -> int | None:
    """The most items a map's list can hold, when its context_schema says (a simple
    `context.key` path to an array with maxItems), or None."""
    path = items.strip()
    if not re.fullmatch(r"context\.[A-Za-z_][A-Za-z0-9_]*", path):
        return None
    declared = (d.context_schema or {}).get("properties", {}).get(path.split(".", 1)[1])
    if isinstance(declared, dict) and isinstance(declared.get("maxItems"), int):
        return int(declared["maxItems"])
    return None


def _body_problems(
    d: MachineDefinition,
    state: StateDefinition,
    branch: str | None,
    body: Body,
    source: str,
    machine_problems: MachineProblems,
) -> Iterator[Problem]:
    name = state.name
    where = f"{name}.{branch}" if branch is not None else name
    field = "map" if state.map is not None else ("parallel.branches" if branch else None)
    if body.machine is not None:
        inline = [
            f for f in ("initial_state", "states", "agent_type") if f in body.model_fields_set
        ]
        if inline:
            yield Problem(
                f"a body runs a machine or states of its own, not both ({', '.join(inline)})",
                source,
                where,
                field,
            )
    elif not body.states or body.initial_state is None:
        yield Problem(
            "a body needs states and initial_state, or machine: another definition's type",
            source,
            where,
            field,
        )
    yield from _input_problems(body, source, where)
    if body.machine is None and body.states and body.initial_state is not None:
        inner = d.inline(name, branch)
        for problem in machine_problems(inner, source):
            inner_state = f"{where}.{problem.state}" if problem.state else where
            yield Problem(problem.message, source, inner_state, problem.field)


def _input_problems(body: Body, source: str, where: str) -> Iterator[Problem]:
    expressions = (
        {"input": body.input}
        if isinstance(body.input, str)
        else {f"input.{k}": v for k, v in (body.input or {}).items()}
    )
    for field, expression in expressions.items():
        problem = compile_problem(expression)
        if problem is not None:
            yield Problem(f"{expression!r} {problem}", source, where, field)


def tree_problems(
    definitions: Mapping[str, MachineDefinition], max_depth: int
) -> Iterator[Problem]:
    """What is wrong between definitions: a `machine:` naming no loaded type, definitions that
    start each other in a cycle, children nested deeper than max_depth."""
    starts: dict[str, set[str]] = {}
    for machine_type, d in definitions.items():
        starts[machine_type] = set()
        for state, branch, body, inner in _nested(d):
            if body.machine is None:
                continue
            starts[machine_type].add(body.machine)
            if body.machine not in definitions:
                where = f"{inner.type}.{state.name}".split(".", 1)[1]
                where += f".{branch}" if branch else ""
                yield Problem(
                    f"machine {body.machine!r} is not a loaded definition", machine_type, where
                )
    cycle = _cycle(starts)
    if cycle is not None:
        text = "definitions start each other in a cycle: " + " -> ".join(cycle)
        for machine_type in dict.fromkeys(cycle):  # under each, whichever of them is loaded
            yield Problem(text, machine_type, None)
        return
    depths: dict[str, int] = {}
    for machine_type in sorted(definitions):
        deepest = _depth(machine_type, definitions, depths)
        if deepest > max_depth:
            yield Problem(
                f"children nest {deepest} deep, past FSM_MAX_CHILD_DEPTH={max_depth}",
                machine_type,
            )


def _nested(
    d: MachineDefinition,
) -> Iterator[tuple[StateDefinition, str | None, Body, MachineDefinition]]:
    """Every (state, branch, body) inside d, its inline bodies' own included, with the
    definition each is in."""
    for state in d.states:
        for branch, body in d.children(state):
            yield state, branch, body, d
            if body.machine is None and body.initial_state is not None:
                yield from _nested(d.inline(state.name, branch))


def _cycle(starts: dict[str, set[str]]) -> list[str] | None:
    path: list[str] = []
    done: set[str] = set()

    def visit(node: str) -> list[str] | None:
        if node in path:
            return [*path[path.index(node) :], node]
        if node in done or node not in starts:
            return None
        path.append(node)
        for target in sorted(starts[node]):
            found = visit(target)
            if found is not None:
                return found
        path.pop()
        done.add(node)
        return None

    for node in sorted(starts):
        found = visit(node)
        if found is not None:
            return found
    return None


def _depth(
    machine_type: str, definitions: Mapping[str, MachineDefinition], memo: dict[str, int]
) -> int:
    """How deep children nest under a machine of the type (0: it starts none)."""
    if machine_type not in memo:
        memo[machine_type] = 0  # no cycles here: _cycle refused them first
        memo[machine_type] = _inline_depth(definitions[machine_type], definitions, memo)
    return memo[machine_type]


def _inline_depth(
    d: MachineDefinition, definitions: Mapping[str, MachineDefinition], memo: dict[str, int]
) -> int:
    deepest = 0
    for state in d.states:
        for branch, body in d.children(state):
            if body.machine is not None:
                below = (
                    _depth(body.machine, definitions, memo) if body.machine in definitions else 0
                )
            else:
                below = _inline_depth(d.inline(state.name, branch), definitions, memo)
            deepest = max(deepest, 1 + below)
    return deepest
