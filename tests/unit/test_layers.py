"""The package's layers, each importing only from its own and those below it:

    ground < core < store < engine < adapters < client < composition root < doors

so that the picture of the house reads one way (docs/architecture.md draws it). Every package
and top-level module of fsm_celery has its layer here: a new one fails until it is given one.
Read from the source, as tests/unit/test_import_cycles.py reads it (which keeps out cycles
within a layer)."""

from __future__ import annotations

from tests.unit.test_import_cycles import _graph, _package

LAYERS: list[tuple[str, set[str]]] = [
    # what everything may use: the error tree, the terminal's colours, addresses, processes
    (
        "ground",
        {"exceptions", "terminal", "redis_address", "secret_strength", "processes", "devstack"},
    ),
    ("core", {"core"}),  # pure: the definitions, the decisions, the wire messages
    ("store", {"store", "config", "records"}),  # the tables and SQL; the settings; the records
    ("engine", {"engine"}),  # the use cases, on ports
    # the ways in and out: Redis and agents' messages, Celery, the agent SDK
    ("adapters", {"acks", "channel", "worker", "agent", "pipeline", "langgraph"}),
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
            "cli_common",
            "cli_gates",
            "cli_history",
            "cli_run",
            "definition_reference",
            "demo",
            "doctor",
            "exits",
            "http",
            "init",
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
