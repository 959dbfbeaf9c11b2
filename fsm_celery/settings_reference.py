"""README's table of the FSM_* settings (`make docs`), made from fsm_celery/config.py: each
setting's type, default, and the docstring under its field as its meaning."""

from __future__ import annotations

import ast
import itertools
import sys
from pathlib import Path

from pydantic_settings import BaseSettings

from fsm_celery import config


def parts() -> list[type[BaseSettings]]:
    """Settings and the parts it is made of (its bases), in the order the table shows them."""
    return [c for c in config.Settings.__mro__ if c is not BaseSettings and _settings(c)]


def _settings(cls: type) -> bool:
    return isinstance(cls, type) and issubclass(cls, BaseSettings) and cls is not BaseSettings


def descriptions() -> dict[str, str]:
    """Each setting's description, the docstring under its field, on one line: read from the
    source of the class that declares it when asked (pydantic's use_attribute_docstrings would
    cost every process a tenth of a second to start). In declaration order, Settings's first."""
    found: dict[str, str] = {}
    for part in parts():
        module = sys.modules[part.__module__]
        tree = ast.parse(Path(str(module.__file__)).read_text(encoding="utf-8"))
        body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == part.__name__)
        for field, doc in itertools.pairwise(body.body):
            if not (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)):
                continue
            if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
                found[field.target.id] = " ".join(str(doc.value.value).split())
    return found


def settings_reference() -> str:
    """The README's table of the FSM_* settings, from the fields of Settings and its parts."""
    lines = ["| Setting | Default | Meaning |", "| --- | --- | --- |"]
    meanings = descriptions()
    fields = config.Settings.model_fields
    for name in meanings:
        info = fields[name]
        default = info.get_default(call_default_factory=True)
        shown = "(unset)" if default in (None, "") else f"`{default}`"
        if isinstance(default, bool):
            shown = f"`{str(default).lower()}`"
        lines.append(f"| `FSM_{name.upper()}` | {shown} | {meanings[name]} |")
    return "\n".join(lines) + "\n"


def write_reference(readme: Path) -> bool:
    """Put the settings table between the README's settings markers; whether it changed."""
    text = readme.read_text()
    begin, end = "<!-- settings:begin -->\n", "<!-- settings:end -->"
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    updated = head + begin + settings_reference() + end + tail
    readme.write_text(updated)
    return updated != text


if __name__ == "__main__":  # make docs
    write_reference(Path(__file__).resolve().parent.parent / "README.md")
