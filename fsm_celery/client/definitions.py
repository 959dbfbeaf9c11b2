"""The client's machine definitions: loaded from YAML, listed, and read back by version
with what the checker finds in them."""

from __future__ import annotations

from typing import Any

from fsm_celery.client.base import ClientBase, dicts
from fsm_celery.core.loader import definition_files, load_all, parse_definition
from fsm_celery.core.validator import validate
from fsm_celery.exceptions import DefinitionError, UnknownMachineType
from fsm_celery.records import DefinitionVersion


class Definitions(ClientBase):
    """Load and read machine definitions."""

    def load_definitions(self, path: str | None = None) -> list[tuple[str, int, bool]]:
        """Load the YAML definitions at path (file or folder): (type, version, created)."""
        files = definition_files(path or self.engine.settings.definitions)
        return self.engine.catalog.load(load_all(files))

    def machine_types(self) -> list[str]:
        """Every machine type with a loaded definition."""
        return self.reader.machine_types()

    def agent_types(self) -> list[str]:
        """Every agent type a loaded definition names."""
        return self.reader.agent_types()

    def definition_versions(self) -> list[dict[str, Any]]:
        """Every stored version of every machine type (newest first per type)."""
        return dicts(self.reader.definition_versions())

    def definition(self, machine_type: str, version: int | None = None) -> DefinitionVersion:
        """One version of a machine type (the latest by default), and its checker's problems.
        A child's inline type (`type.STATE[.branch]`) is part of its root type's version."""
        root_type = machine_type.split(".", 1)[0]
        row, versions = self.reader.definition(root_type, version)
        if row is None:
            raise UnknownMachineType(machine_type, self.machine_types())
        source = f"{root_type} v{row.version}"
        definition = parse_definition(row.body, source, check=False)
        try:  # checked when it was loaded; a newer checker may find more
            validate(definition, source)
            problems: list[str] = []
        except DefinitionError as exc:
            problems = [str(p) for p in exc.problems]
        if machine_type != root_type:
            try:
                definition = definition.at(machine_type)
            except (KeyError, IndexError, AssertionError):  # a place the definition has not
                raise UnknownMachineType(machine_type, self.machine_types()) from None
        return DefinitionVersion(
            machine_type, row.version, row.created_at, definition, problems, versions
        )
