"""The package's layers, each importing only from its own and those below it:

    ground < core < store < engine < adapters < client < composition root < doors

so that the picture of the house reads one way (docs/architecture.md draws it). Every package
and top-level module of fsm_celery has its layer here: a new one fails until it is given one.
Read from the source, as tests/unit/test_import_cycles.py reads it (which keeps out cycles
within a layer)."""

from __future__ import annotations

import os
from pathlib import Path

from tests.unit.test_import_cycles import _graph, _package

LAYERS: list[tuple[str, set[str]]] = [
    # what everything may use: the error tree, the terminal's colours, addresses, processes
    (
        "ground",
        {
            "exceptions",
            "terminal",
            "redis_address",
            "secret_strength",
            "processes",
            "devstack",
            "urls",
        },
    ),
    ("core", {"core"}),  # pure: the definitions, the decisions, the wire messages
    (
        "store",
        {"store", "config", "config_agents", "config_observability", "records"},
    ),  # the tables and SQL; the settings; the records
    ("engine", {"engine"}),  # the use cases, on ports
    # the ways in and out: Redis and agents' messages, Celery, the agent SDK
    ("adapters", {"acks", "channel", "worker", "agent", "pipeline", "langgraph", "metrics"}),
    ("client", {"client"}),  # the Python client the doors run on
    ("composition root", {"wiring"}),  # builds every process's parts from its settings
    # where people and processes come in: commands, HTTP, the Celery processes, the package
    (
        "doors",
        {
            "fsm_celery",
            "__main__",
            "api",
            "celery",
            "cli",
            "definition_reference",
            "settings_reference",
            "demo",
            "demo_mcp",
            "doctor",
            "exits",
            "http",
            "init",
            "mcp",
            "views",
        },
    ),
]


def layer_of() -> dict[str, int]:
    """Each package's or top-level module's layer, by its full name."""
    ranks = {}
    for rank, (_, names) in enumerate(LAYERS):
        for name in names:
            ranks["fsm_celery" if name == "fsm_celery" else f"fsm_celery.{name}"] = rank
    return ranks


def test_every_package_has_a_layer() -> None:
    graph = _graph(_package)
    units = set(graph) | {target for targets in graph.values() for target in targets}
    assert sorted(units - set(layer_of())) == []


def test_no_import_goes_from_a_lower_layer_to_a_higher_one() -> None:
    ranks = layer_of()
    upward = [
        f"{source} ({LAYERS[ranks[source]][0]}) imports {target} ({LAYERS[ranks[target]][0]})"
        for source, targets in _graph(_package).items()
        for target in targets
        if ranks.get(target, 0) > ranks.get(source, 0)
    ]
    assert sorted(upward) == []


# ---- docs/architecture.md's picture of the house, drawn from the imports ------------------

ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "architecture.md"
BEGIN, END = "<!-- imports:begin -->\n", "<!-- imports:end -->"


def _short(unit: str) -> str:
    return "fsm_celery (the package)" if unit == "fsm_celery" else unit.removeprefix("fsm_celery.")


def _node(unit: str) -> str:
    return _short(unit).split(" ")[0].replace(".", "_")


def _reduced(graph: dict[str, set[str]]) -> dict[str, set[str]]:
    """The arrows left once those implied by a longer way round are dropped (the graph has no
    cycles: the cycle test keeps it so)."""
    reach: dict[str, set[str]] = {}

    def reached(unit: str) -> set[str]:
        if unit not in reach:
            reach[unit] = set()
            for target in graph.get(unit, ()):
                reach[unit] |= {target} | reached(target)
        return reach[unit]

    return {
        unit: {t for t in targets if not any(t in reached(o) for o in targets - {t})}
        for unit, targets in graph.items()
    }


def picture() -> str:
    """The import graph between fsm_celery's packages, by layer: a mermaid drawing (each arrow
    an import, direct or by a longer way; the ground layer's arrows left out: everything may
    use it), and every direct import in words."""
    ranks = layer_of()
    graph = _graph(_package)
    lines = ["```mermaid", "flowchart TB"]
    for rank in reversed(range(len(LAYERS))):
        name, _ = LAYERS[rank]
        units = sorted(u for u, r in ranks.items() if r == rank)
        lines.append(f'  subgraph L{rank}["{name}"]')
        lines += [f'    {_node(u)}["{_short(u).split(" ")[0]}"]' for u in units]
        lines.append("  end")
    drawn = _reduced({u: {t for t in ts if ranks[t] > 0} for u, ts in graph.items()})
    for unit in sorted(drawn):
        lines += [f"  {_node(unit)} --> {_node(t)}" for t in sorted(drawn[unit])]
    lines += ["```", "", "Every import between them, by layer, from the top:", ""]
    for rank in reversed(range(len(LAYERS))):
        lines.append(f"- **{LAYERS[rank][0]}**")
        for unit in sorted(u for u, r in ranks.items() if r == rank):
            targets = ", ".join(sorted(_short(t) for t in graph.get(unit, ()))) or "nothing"
            lines.append(f"  - `{_short(unit)}` imports {targets}")
    return "\n".join(lines) + "\n"


def test_architecture_doc_draws_the_import_graph_as_it_is() -> None:
    if os.environ.get("FSM_WRITE_DOCS"):  # make docs
        head, _, rest = ARCHITECTURE.read_text().partition(BEGIN)
        ARCHITECTURE.write_text(head + BEGIN + picture() + END + rest.partition(END)[2])
    assert ARCHITECTURE.read_text().partition(BEGIN)[2].partition(END)[0] == picture()
