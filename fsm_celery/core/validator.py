"""The static validator: what a definition's field checks cannot see (names, edges, gates,
the graph, the context), every problem at once."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from typing import Literal

import jinja2

from fsm_celery.core import gate
from fsm_celery.core.context import context_problem, schema_problem
from fsm_celery.core.contract_validator import contract_problems
from fsm_celery.core.definition import (
    Edge,
    MachineDefinition,
    StateDefinition,
    compile_problem,
)
from fsm_celery.core.fanout_validator import fanout_problems
from fsm_celery.core.gate import Approval
from fsm_celery.core.prompt import TEMPLATES, variables
from fsm_celery.core.signal import Wait
from fsm_celery.core.tool_validator import tool_problems
from fsm_celery.exceptions import DefinitionError, Problem


def validate(definition: MachineDefinition, source: str = "<definition>") -> None:
    """Raise DefinitionError listing every structural problem of the definition."""
    problems = list(_problems(definition, source))
    if problems:
        raise DefinitionError(problems)


def _problems(d: MachineDefinition, source: str) -> Iterator[Problem]:
    names = [s.name for s in d.states]
    seen: set[str] = set()
    for name in names:
        if name in seen:
            yield Problem(f"duplicate state name {name!r}", source, name, "name")
        seen.add(name)
    schedules = [s.name for s in d.schedules]
    for i, name in enumerate(schedules):
        if name in schedules[:i]:
            yield Problem(f"duplicate schedule name {name!r}", source, None, "schedules")
    if d.initial_state not in seen:
        yield Problem(
            f"initial state {d.initial_state!r} is not one of the states",
            source,
            None,
            "initial_state",
        )
    if (
        _has_loops(d)
        and d.on_loop_exhausted in seen
        and d.state(d.on_loop_exhausted).terminal is None
    ):
        yield Problem(
            f"on_loop_exhausted must be a terminal state, {d.on_loop_exhausted!r} is not: "
            "a machine past its loop bound would loop on",
            source,
            None,
            "on_loop_exhausted",
        )
    if _has_loops(d) and d.on_loop_exhausted not in seen:
        yield Problem(
            f"target {d.on_loop_exhausted!r} is not one of the states",
            source,
            None,
            "on_loop_exhausted",
        )
    for state in d.states:
        yield from _state_problems(state, seen, source)
        yield from fanout_problems(d, state, source, _problems)
    known = not any(p for p in _edge_targets_unknown(d, seen))
    if known:  # else graph checks would only repeat the unknown targets
        yield from _graph_problems(d, source)
    yield from _context_problems(d, source, known)


def _edge_targets_unknown(d: MachineDefinition, names: set[str]) -> Iterator[str]:
    for state in d.states:
        for edge in state.edges:
            if edge.target not in names:
                yield edge.target
    if d.initial_state not in names:
        yield d.initial_state
    if _has_loops(d) and d.on_loop_exhausted not in names:
        yield d.on_loop_exhausted


def _has_loops(d: MachineDefinition) -> bool:
    return any(edge.loop for state in d.states for edge in state.edges)


# The longest a state's timeout, heartbeat window, max_duration or retry delay may be: an attempt
# that waits longer is a schedule or an approval, not an agent's work. Versions stored before the
# bound are read as they were checked then (fsm_celery.store.queries).
LONGEST_WAIT = timedelta(days=30)


def _too_long(state: StateDefinition) -> Iterator[str]:
    waits = {
        "timeout": state.timeout,
        "heartbeat_timeout": state.heartbeat_timeout,
        "max_duration": state.max_duration,
        "backoff": state.backoff.max_delay,
    }
    for field, wait in waits.items():
        if wait is not None and wait > LONGEST_WAIT:
            yield field


def _timing_problems(state: StateDefinition, source: str) -> Iterator[Problem]:
    name = state.name
    for field in _too_long(state):
        yield Problem(f"{field} must be at most 30 days (2592000s)", source, name, field)
    if state.timeout <= timedelta(0):
        yield Problem(
            f"timeout must be positive, got {state.timeout_seconds:g}s", source, name, "timeout"
        )
    if state.heartbeat_timeout is not None and state.heartbeat_timeout <= timedelta(0):
        yield Problem("heartbeat_timeout must be positive", source, name, "heartbeat_timeout")
    if state.max_duration is not None and state.max_duration < state.timeout:
        yield Problem("max_duration must be at least timeout", source, name, "max_duration")
    if state.backoff.delay < timedelta(0) or state.backoff.max_delay < state.backoff.delay:
        yield Problem("backoff needs 0 <= delay <= max_delay", source, name, "backoff")


def _state_problems(state: StateDefinition, names: set[str], source: str) -> Iterator[Problem]:
    name = state.name
    yield from _timing_problems(state, source)
    yield from tool_problems(state, source)
    if state.awaits:
        yield from _awaiting_problems(state, names, source)
        return
    yield from _gate_fields_elsewhere(state, source)
    if state.terminal is not None:
        if state.edges:
            field = "on_success" if state.on_success else "on_failure"
            yield Problem("a terminal state has no edges", source, name, field)
        return
    if not state.on_success:
        yield Problem("a non-terminal state needs on_success", source, name, "on_success")
    if state.on_failure is None:
        yield Problem("a non-terminal state needs on_failure", source, name, "on_failure")
    yield from _edge_problems(state, names, source)
    if state.on_failure is not None and state.on_failure.when is not None:
        yield Problem("a failure edge takes no guard (when:)", source, name, "on_failure")
    if state.on_success and state.on_success[-1].when is not None:
        yield Problem(
            "the last on_success edge must have no guard (it is the default)",
            source,
            name,
            "on_success",
        )
    try:
        TEMPLATES.parse(state.prompt)
    except jinja2.TemplateSyntaxError as exc:
        yield Problem(f"prompt template does not compile: {exc}", source, name, "prompt")
    yield from contract_problems(state, source)


# What an approval state has none of: people decide it, from its form, at once or by its deadline.
NOT_AT_A_GATE = (
    "terminal",
    "prompt",
    "required_output",
    "output_schema",
    "max_corrections",
    "on_success",
    "on_failure",
    "max_retries",
    "heartbeat_timeout",
    "max_duration",
    "agent_type",
    "parallel",
    "map",
    "machine",
)


def _awaiting_problems(state: StateDefinition, names: set[str], source: str) -> Iterator[Problem]:
    """What is wrong with a state people or an outside event decide."""
    if state.approval is not None and state.wait is not None:
        yield Problem(
            "a state waits for people or for an event, not both", source, state.name, "wait"
        )
    elif state.approval is not None:
        yield from _gate_problems(state, state.approval, names, source)
    elif state.wait is not None:
        yield from _wait_problems(state, state.wait, names, source)


def _gate_fields_elsewhere(state: StateDefinition, source: str) -> Iterator[Problem]:
    for field in ("on_approve", "on_reject", "on_timeout", "on_event"):
        if field in state.model_fields_set:
            kind = "a waiting" if field == "on_event" else "an approval or a waiting"
            yield Problem(f"{field} applies to {kind} state", source, state.name, field)


def _wait_problems(
    state: StateDefinition, wait: Wait, names: set[str], source: str
) -> Iterator[Problem]:
    name = state.name
    for field in (*NOT_AT_A_GATE, "on_approve", "on_reject"):
        if field in state.model_fields_set:
            yield Problem(
                f"a waiting state has no {field}: an event decides it", source, name, field
            )
    if not state.on_event:
        yield Problem("a waiting state needs on_event", source, name, "on_event")
    elif state.on_event[-1].when is not None:
        yield Problem(
            "the last on_event edge must have no guard (it is the default)",
            source,
            name,
            "on_event",
        )
    if state.on_timeout is None or state.on_timeout in (gate.APPROVE, gate.REJECT):
        yield Problem(
            "a waiting state needs on_timeout: the state it goes to when no event came",
            source,
            name,
            "on_timeout",
        )
    yield from _edge_problems(state, names, source)
    if wait.form is not None:
        problem = schema_problem(wait.form)
        if problem is not None:
            yield Problem(problem.replace("a context", "a payload"), source, name, "wait.schema")


def _gate_problems(
    state: StateDefinition, approval: Approval, names: set[str], source: str
) -> Iterator[Problem]:
    name = state.name
    for field in (*NOT_AT_A_GATE, "on_event"):
        if field in state.model_fields_set:
            yield Problem(
                f"an approval state has no {field}: people decide it", source, name, field
            )
    for field in ("on_approve", "on_reject"):
        edges: tuple[Edge, ...] = getattr(state, field)
        if not edges:
            yield Problem(f"an approval state needs {field}", source, name, field)
        elif edges[-1].when is not None:
            yield Problem(
                f"the last {field} edge must have no guard (it is the default)",
                source,
                name,
                field,
            )
    yield from _edge_problems(state, names, source)
    if isinstance(approval.quorum, int) and approval.quorum < 1:
        yield Problem(
            f"quorum must be at least 1, or all; got {approval.quorum}",
            source,
            name,
            "approval.quorum",
        )
    if approval.form is not None:
        problem = schema_problem(approval.form)
        if problem is not None:
            yield Problem(
                problem.replace("a context", "a decision"), source, name, "approval.schema"
            )


def _edge_problems(state: StateDefinition, names: set[str], source: str) -> Iterator[Problem]:
    for field, edge in _labelled_edges(state):
        if edge.target not in names:
            yield Problem(f"unknown target state {edge.target!r}", source, state.name, field)
        problem = None if edge.when is None else compile_problem(edge.when)
        if problem is not None:
            yield Problem(f"guard {edge.when!r} {problem}", source, state.name, field)


def _labelled_edges(state: StateDefinition) -> Iterator[tuple[str, Edge]]:
    for i, edge in enumerate(state.on_success):
        yield f"on_success[{i}]", edge
    if state.on_failure is not None:
        yield "on_failure", state.on_failure
    for field in ("on_approve", "on_reject", "on_event"):
        for i, edge in enumerate(getattr(state, field)):
            yield f"{field}[{i}]", edge
    for edge in state.escalation:
        yield "on_timeout", edge


def _graph_problems(d: MachineDefinition, source: str) -> Iterator[Problem]:
    graph = {s.name: {e.target for e in s.edges} for s in d.states}
    for s in d.states:
        if any(e.loop for e in s.edges):  # taking a loop edge past the bound exits here
            graph[s.name].add(d.on_loop_exhausted)
    reachable = _reach(graph, [d.initial_state])
    for state in d.states:
        if state.name not in reachable:
            yield Problem("unreachable from the initial state", source, state.name, None)
    terminals = [s.name for s in d.states if s.terminal is not None]
    if not terminals:
        yield Problem("no terminal state (terminal: completed|failed)", source, None, "states")
        return
    reverse: dict[str, set[str]] = {name: set() for name in graph}
    for origin, targets in graph.items():
        for target in targets:
            reverse[target].add(origin)
    finishing = _reach(reverse, terminals)
    for state in d.states:
        if state.name not in finishing:
            yield Problem("cannot reach a terminal state", source, state.name, None)
    yield from _unbounded_cycles(d, source)


def _reach(graph: dict[str, set[str]], starts: list[str]) -> set[str]:
    seen: set[str] = set()
    stack = list(starts)
    while stack:
        node = stack.pop()
        if node not in seen:
            seen.add(node)
            stack.extend(graph.get(node, ()))
    return seen


def _unbounded_cycles(d: MachineDefinition, source: str) -> Iterator[Problem]:
    """Every cycle must pass through an edge marked loop: true, which the machine bound counts."""
    graph = {s.name: [e.target for e in s.edges if not e.loop] for s in d.states}
    state: dict[str, Literal[1, 2]] = {}  # 1 = on the current path, 2 = done
    for root in graph:
        if root in state:
            continue
        stack: list[tuple[str, Iterator[str]]] = [(root, iter(graph[root]))]
        state[root] = 1
        while stack:
            node, children = stack[-1]
            child = next(children, None)
            if child is None:
                state[node] = 2
                stack.pop()
            elif state.get(child) == 1:
                yield Problem(
                    f"cycle through {child!r} has no edge marked loop: true, so nothing bounds it",
                    source,
                    node,
                    None,
                )
            elif child not in state:
                state[child] = 1
                stack.append((child, iter(graph[child])))


def _context_problems(d: MachineDefinition, source: str, targets_known: bool) -> Iterator[Problem]:
    if d.context_schema is None:
        return
    problem = schema_problem(d.context_schema)
    if problem is not None:
        yield Problem(problem, source, None, "context_schema")
        return
    for i, schedule in enumerate(d.schedules):  # checked again at each tick, by the start
        mismatch = context_problem(d.context_schema, schedule.context)
        if mismatch is not None:
            field = f"schedules[{i}].context"
            yield Problem(f"does not match the context_schema: {mismatch}", source, None, field)
    if targets_known and not any(_prompt_errors(d)):
        yield from _unprovided_variables(d, source)


def _prompt_errors(d: MachineDefinition) -> Iterator[str]:
    for state in d.states:
        try:
            TEMPLATES.parse(state.prompt)
        except jinja2.TemplateSyntaxError as exc:
            yield str(exc)


def _unprovided_variables(d: MachineDefinition, source: str) -> Iterator[Problem]:
    """A prompt that uses a key neither the context_schema requires nor every way into its
    state provides (a required output of a state whose success leads there) cannot render
    on that way. Only checked with a schema: without one, what a context holds is unknown."""
    required = (d.context_schema or {}).get("required", [])
    # with the loop counters every context holds (core.transition: LOOP_COUNT, LOOP_LIMIT)
    given = _provided_on_entry(d, frozenset(required) | {"retryCount", "maxRetries"})
    for state in d.states:
        missing = sorted(variables(state.prompt)[0] - given.get(state.name, frozenset()))
        if missing and state.terminal is None and state.name in given:
            yield Problem(
                f"the prompt uses {', '.join(missing)}, which the context_schema does not "
                "require and not every way into this state provides (require it, or test it: "
                "{% if x %}, x | default(...))",
                source,
                state.name,
                "prompt",
            )


def _provided_on_entry(d: MachineDefinition, start: frozenset[str]) -> dict[str, frozenset[str]]:
    """The keys a context surely holds on entering each reachable state: what holds on every
    edge into it (a success edge adds its state's required output), to a fixed point."""
    given: dict[str, frozenset[str]] = {d.initial_state: start}
    changed = True
    while changed:
        changed = False
        for state in d.states:
            if state.name not in given or state.terminal is not None:
                continue
            after = given[state.name] | set(state.required_output) | _merged_keys(d, state)
            for edge, keys in _ways_out(d, state, after, given[state.name]):
                merged = keys if edge not in given else given[edge] & keys
                if given.get(edge) != merged:
                    given[edge] = merged
                    changed = True
    return given


def _merged_keys(d: MachineDefinition, state: StateDefinition) -> frozenset[str]:
    """The keys a fan-out state's join writes into the context."""
    if state.parallel is not None:
        return frozenset(b.name for b in state.parallel.branches)
    if state.map is not None:
        return frozenset({state.map.result_key or state.name})
    return frozenset(state.output or ())


def _ways_out(
    d: MachineDefinition, state: StateDefinition, succeeded: frozenset[str], failed: frozenset[str]
) -> Iterator[tuple[str, frozenset[str]]]:
    if state.approval is not None:
        yield from _ways_out_of_gate(d, state, state.approval, failed)
        return
    if state.wait is not None:  # the payload's required keys; nothing when it times out
        arrived = failed | set((state.wait.form or {}).get("required", ()))
        for edge in state.on_event:
            yield edge.target, arrived
            if edge.loop:
                yield d.on_loop_exhausted, arrived
        for edge in state.escalation:
            yield edge.target, failed
        return
    for edge in state.on_success:
        yield edge.target, succeeded
        if edge.loop:
            yield d.on_loop_exhausted, succeeded
    if state.on_failure is not None:
        yield state.on_failure.target, failed
        if state.on_failure.loop:
            yield d.on_loop_exhausted, failed


def _ways_out_of_gate(
    d: MachineDefinition, state: StateDefinition, approval: Approval, entered: frozenset[str]
) -> Iterator[tuple[str, frozenset[str]]]:
    """An approval's verdict adds its summary, and an approval its form's required fields
    (unless its deadline may approve, with none); an escalation adds nothing."""
    decided = entered | {gate.SUMMARY_KEY}
    approved = decided
    if state.on_timeout != gate.APPROVE:
        approved |= set((approval.form or {}).get("required", ()))
    for edges, keys in ((state.on_approve, approved), (state.on_reject, decided)):
        for edge in edges:
            yield edge.target, keys
            if edge.loop:
                yield d.on_loop_exhausted, keys
    for edge in state.escalation:
        yield edge.target, entered
