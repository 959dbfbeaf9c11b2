"""A definition as a graph: its states as nodes and its edges, as data (the dashboard lays it
out with dagre) and as Graphviz DOT text (for anyone who renders with Graphviz). A parallel
state carries its branches (each a graph of its own inline states, or a child machine of
another definition), drawn as a cluster; a map state is one node, whatever its items. Pure."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from typing import Any

from fsm_celery.core.definition import AtLeast, MachineDefinition, StateDefinition

SUCCESS, GUARDED, FAILURE, LOOP_EXHAUSTED = "success", "guarded", "failure", "loop_exhausted"
TASK, PARALLEL, MAP, MACHINE = "task", "parallel", "map", "machine"
APPROVAL, WAIT = "approval", "wait"


@dataclass(frozen=True)
class Node:
    id: str
    description: str
    initial: bool
    terminal: str | None  # completed, failed, or None
    timeout_seconds: float
    max_retries: int
    required_output: tuple[str, ...]
    kind: str = TASK  # task, parallel, map, machine, approval
    detail: str = ""  # a parallel state's join, a map's items, a child machine's type, a gate's
    # quorum and groups


@dataclass(frozen=True)
class Link:
    source: str
    target: str
    kind: str  # success, guarded, failure, loop_exhausted
    label: str  # the guard, "loop", or "" (failure edges are drawn as such)


@dataclass(frozen=True)
class Branch:
    """One branch of a parallel state: its own states' graph, or a machine of another type."""

    name: str
    graph: Graph | None
    machine: str | None

    def to_dict(self) -> dict[str, Any]:
        inner = self.graph.to_dict() if self.graph is not None else None
        return {"name": self.name, "machine": self.machine, "graph": inner}


@dataclass(frozen=True)
class Graph:
    nodes: tuple[Node, ...]
    links: tuple[Link, ...]
    branches: dict[str, tuple[Branch, ...]]  # each parallel state's, by its name

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [asdict(n) for n in self.nodes],
            "links": [asdict(link) for link in self.links],
            "branches": {
                state: [b.to_dict() for b in branches] for state, branches in self.branches.items()
            },
        }


def graph(definition: MachineDefinition) -> Graph:
    """The states and every edge between them, in definition order; each parallel state's
    branches, each drawn the same way."""
    nodes = tuple(
        Node(
            id=s.name,
            description=s.description,
            initial=s.name == definition.initial_state,
            terminal=s.terminal.value if s.terminal is not None else None,
            timeout_seconds=s.timeout_seconds,
            max_retries=s.max_retries,
            required_output=s.required_output,
            kind=_kind(s),
            detail=_detail(s),
        )
        for s in definition.states
    )
    branches = {
        s.name: tuple(
            Branch(b.name, None, b.machine)
            if b.machine is not None
            else Branch(b.name, graph(definition.inline(s.name, b.name)), None)
            for b in s.parallel.branches
        )
        for s in definition.states
        if s.parallel is not None
    }
    links: list[Link] = []
    for state in definition.states:
        for edge in state.on_success:
            kind = GUARDED if edge.when else SUCCESS
            label = edge.when or ""
            if edge.loop:
                label = f"{label} (loop)".strip()
            links.append(Link(state.name, edge.target, kind, label))
        if state.on_failure is not None:
            links.append(Link(state.name, state.on_failure.target, FAILURE, "failure"))
        links += _gate_links(state)
        if any(e.loop for e in state.edges):  # past the loop bound the machine goes here
            links.append(
                Link(state.name, definition.on_loop_exhausted, LOOP_EXHAUSTED, "loops spent")
            )
    return Graph(nodes, tuple(links), branches)


def _gate_links(state: StateDefinition) -> list[Link]:
    """An approval's or a wait's ways out: approved (guarded or not), rejected, the event
    arrived, and its deadline's."""
    links = []
    event = state.wait.event if state.wait is not None else "event"
    for verdict, edges in (
        ("approved", state.on_approve),
        ("rejected", state.on_reject),
        (event, state.on_event),
    ):
        for edge in edges:
            label = f"{verdict}: {edge.when}" if edge.when else verdict
            if edge.loop:
                label += " (loop)"
            kind = FAILURE if verdict == "rejected" else GUARDED if edge.when else SUCCESS
            links.append(Link(state.name, edge.target, kind, label))
    for edge in state.escalation:
        what = "no event" if state.wait is not None else "no decision"
        links.append(Link(state.name, edge.target, FAILURE, f"{what}: timeout"))
    return links


def _kind(state: StateDefinition) -> str:
    if state.approval is not None:
        return APPROVAL
    if state.wait is not None:
        return WAIT
    if state.parallel is not None:
        return PARALLEL
    if state.map is not None:
        return MAP
    return MACHINE if state.machine is not None else TASK


def _detail(state: StateDefinition) -> str:
    """What a fan-out state starts, in a few words."""
    if state.parallel is not None:
        join = state.parallel.join
        return f"join: at least {join.at_least}" if isinstance(join, AtLeast) else f"join: {join}"
    if state.map is not None:
        body = f" → {state.map.machine}" if state.map.machine is not None else ""
        return f"map over {state.map.items}{body}"
    if state.approval is not None:
        quorum = state.approval.quorum
        return f"{quorum} of {', '.join(state.approval.approvers)}"
    if state.wait is not None:
        return f"waits for {state.wait.event}"
    return f"→ {state.machine}" if state.machine is not None else ""


def to_dot(definition: MachineDefinition) -> str:
    """The definition as a Graphviz digraph (`dot -Tsvg` draws it); a parallel state is a
    cluster holding the state, a cluster per branch, and its join, whence its edges leave."""
    head = [f"digraph {_quote(definition.type)} {{", "  rankdir=TB;", "  node [shape=box];"]
    return "\n".join([*head, *_dot_lines(graph(definition), "", "  "), "}"]) + "\n"


def _dot_lines(g: Graph, prefix: str, indent: str) -> list[str]:
    """A graph's nodes and links, its names under `prefix` (a branch's: STATE/branch/)."""
    lines: list[str] = []
    for node in g.nodes:
        style = ["rounded"]
        if node.terminal is not None:
            style.append("bold")
        shape = f'style="{",".join(style)}"' + (", penwidth=2" if node.initial else "")
        text = (
            f"{node.id}\n{node.detail}" if node.kind in (MAP, MACHINE, APPROVAL, WAIT) else node.id
        )
        label = f", label={_quote(text)}" if prefix or text != node.id else ""
        declared = f"{indent}{_quote(prefix + node.id)} [{shape}{label}];"
        branches = g.branches.get(node.id)
        lines += [declared] if branches is None else _dot_cluster(node, branches, prefix, indent)
    for link in g.links:
        attrs = []
        if link.label:
            attrs.append(f"label={_quote(link.label)}")
        if link.kind in (FAILURE, LOOP_EXHAUSTED):
            attrs.append("style=dashed")
        suffix = f" [{', '.join(attrs)}]" if attrs else ""
        source = prefix + link.source + ("/join" if link.source in g.branches else "")
        lines.append(f"{indent}{_quote(source)} -> {_quote(prefix + link.target)}{suffix};")
    return lines


def _dot_cluster(node: Node, branches: tuple[Branch, ...], prefix: str, indent: str) -> list[str]:
    name, inner = prefix + node.id, indent + "  "
    join = _quote(f"{name}/join")
    lines = [f"{indent}subgraph {_quote(f'cluster_{name}')} {{", f"{inner}label={_quote(node.id)};"]
    lines += [f'{inner}{_quote(name)} [style="rounded"{", penwidth=2" if node.initial else ""}];']
    lines += [f'{inner}{join} [label={_quote(node.detail)}, style="rounded,dashed"];']
    for branch in branches:
        box = f"{name}/{branch.name}/"
        lines += [
            f"{inner}subgraph {_quote(f'cluster_{box}')} {{",
            f"{inner}  label={_quote(branch.name)};",
        ]
        if branch.graph is None:
            only = _quote(box)
            lines += [f"{inner}  {only} [label={_quote(f'→ {branch.machine}')}];"]
            ends = [only]
            starts = [only]
        else:
            lines += _dot_lines(branch.graph, box, inner + "  ")
            starts = [_quote(box + n.id) for n in branch.graph.nodes if n.initial]
            ends = [_quote(box + n.id) for n in branch.graph.nodes if n.terminal is not None]
        lines.append(f"{inner}}}")
        lines += [f"{inner}{_quote(name)} -> {s} [style=dotted];" for s in starts]
        lines += [f"{inner}{e} -> {join} [style=dotted];" for e in ends]
    return [*lines, f"{indent}}}"]


def _quote(text: str) -> str:
    return json.dumps(text)  # a DOT string: double quotes, backslash escapes
