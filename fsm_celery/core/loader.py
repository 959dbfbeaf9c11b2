"""Read machine definitions from YAML text and files."""

from __future__ import annotations

import re
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.validator import validate
from fsm_celery.exceptions import DefinitionError, Problem


def _shipped_definitions() -> Path:
    """The definitions that ship with the package: the seed's machines and the research pipeline.
    Their one copy is definitions/ at the repository's top level, which the wheel carries inside
    the package (pyproject.toml maps it there): an installed package finds them among its
    modules, a checkout (or an editable install of one) beside its package folder."""
    package = Path(__file__).resolve().parent.parent
    installed = package / "definitions"
    checkout = package.parent / "definitions"
    return checkout if checkout.is_dir() and not installed.is_dir() else installed


SHIPPED_DEFINITIONS = _shipped_definitions()


class _StrictLoader(yaml.SafeLoader):
    """A safe loader that refuses duplicate mapping keys instead of keeping the last one, and
    aliases: each expands to a copy of its anchor's node, so nested ones (a "billion laughs")
    grow exponentially and would hang every walk of the tree (validation, serialising a
    schedule's context), or exhaust memory."""

    def compose_node(self, parent: yaml.Node | None, index: Any) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(
                None,
                None,
                f"aliases (*{event.anchor}) are not allowed in definitions: write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    keys: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        try:
            hash(key)
        except TypeError:
            raise yaml.constructor.ConstructorError(
                None, None, f"a mapping key must be a plain value, got {key!r}", key_node.start_mark
            ) from None
        if key in keys:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r}", key_node.start_mark
            )
        keys.add(key)
    return loader.construct_mapping(node)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)
# Booleans as YAML 1.2 has them, true and false: YAML 1.1 also reads on, off, yes and no so,
# which turned notify's `on:` key into True (a bool field still takes yes and no as values).
_BOOL = "tag:yaml.org,2002:bool"
_StrictLoader.yaml_implicit_resolvers = {
    first: [(tag, pattern) for tag, pattern in resolvers if tag != _BOOL]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_StrictLoader.add_implicit_resolver(
    _BOOL, re.compile(r"^(?:true|True|TRUE|false|False|FALSE)$"), list("tTfF")
)


def parse_definition(
    data: Any, source: str = "<definition>", *, check: bool = True
) -> MachineDefinition:
    """Build a definition from already-parsed data, and validate it (unless not check: the
    caller reports the static checker's problems itself)."""
    if not isinstance(data, dict):
        raise DefinitionError([Problem("a definition must be a mapping", source)])
    try:
        definition = MachineDefinition.model_validate(data)
    except ValidationError as exc:
        raise DefinitionError([_problem(err, data, source) for err in exc.errors()]) from exc
    if check:
        validate(definition, source)
    return definition


def load_text(text: str, source: str = "<definition>") -> MachineDefinition:
    """Parse and validate one YAML definition."""
    return parse_definition(read_yaml(text, source), source)


def read_yaml(text: str, source: str = "<definition>") -> Any:
    """The data of a YAML text, read as a definition is (DefinitionError naming the line)."""
    try:
        return yaml.load(text, Loader=_StrictLoader)
    except yaml.YAMLError as exc:
        raise DefinitionError([_yaml_problem(exc, source)]) from exc
    except RecursionError as exc:  # brackets nested thousands deep
        raise DefinitionError([Problem("invalid YAML: nested too deeply", source)]) from exc


def _yaml_problem(exc: yaml.YAMLError, source: str) -> Problem:
    """One line, `file:line:column: invalid YAML: what`, of PyYAML's several."""
    if not isinstance(exc, yaml.MarkedYAMLError):
        return Problem(f"invalid YAML: {str(exc).splitlines()[0]}", source)
    mark = exc.problem_mark or exc.context_mark
    what = " ".join(str(exc.problem or exc.context or "").split())
    if exc.context and exc.problem:
        started = exc.context_mark
        at = f" started at line {started.line + 1}" if started and started != mark else ""
        what = f"{what} ({' '.join(exc.context.split())}{at})"
    line, column = (mark.line + 1, mark.column + 1) if mark is not None else (None, None)
    return Problem(f"invalid YAML: {what}", source, line=line, column=column)


def load_file(path: str | Path) -> MachineDefinition:
    """Parse and validate the YAML definition in one file."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise DefinitionError([Problem(f"cannot read: {exc.strerror}", str(path))]) from exc
    except UnicodeDecodeError as exc:
        raise DefinitionError(
            [Problem(f"not UTF-8 text (byte {exc.start}): save it as UTF-8", str(path))]
        ) from exc
    return load_text(text, str(path))


def definition_files(path: str | Path) -> list[Path]:
    """The YAML files a path names: itself, or the *.yaml / *.yml files in a folder."""
    path = Path(path)
    if path.is_dir():
        return sorted(p for p in path.iterdir() if p.suffix in (".yaml", ".yml"))
    return [path]


def load_all(paths: Iterable[Path]) -> list[MachineDefinition]:
    """Load every file, gathering the problems of all of them into one DefinitionError."""
    loaded: list[MachineDefinition] = []
    sources: dict[str, list[str]] = {}
    problems: list[Problem] = []
    for path in paths:
        try:
            definition = load_file(path)
        except DefinitionError as exc:
            problems.extend(exc.problems)
            continue
        loaded.append(definition)
        sources.setdefault(definition.type, []).append(str(path))
    for machine_type, files in sorted(sources.items()):
        if len(files) > 1:
            message = f"machine type {machine_type!r} is defined more than once: {', '.join(files)}"
            problems.append(Problem(message, files[-1]))
    if problems:
        raise DefinitionError(problems)
    return loaded


def _problem(err: Any, data: dict[str, Any], source: str) -> Problem:
    loc = list(err["loc"])
    state: str | None = None
    if len(loc) >= 2 and loc[0] == "states" and isinstance(loc[1], int):
        state = _state_name(data, loc[1])
        loc = loc[2:]
    field = ".".join(str(part) for part in loc) or None
    return Problem(err["msg"], source, state, field)


def _state_name(data: dict[str, Any], index: int) -> str:
    states = data.get("states")
    if isinstance(states, list) and index < len(states) and isinstance(states[index], dict):
        name = states[index].get("name")
        if isinstance(name, str):
            return name
    return f"#{index + 1}"
