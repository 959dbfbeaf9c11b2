"""README's table of the FSM_* settings (`make docs`), made from fsm_celery/config.py: each
setting's type, default, and the docstring under its field as its meaning."""

from __future__ import annotations

import ast
import itertools
from pathlib import Path

from fsm_celery import config


def descriptions() -> dict[str, str]:
    """Each setting's description, the docstring under its field, on one line: read from this
    module's source when asked (pydantic's use_attribute_docstrings would cost every process
    a tenth of a second to start)."""
    tree = ast.parse(Path(config.__file__).read_text(encoding="utf-8"))
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Settings").body
    found: dict[str, str] = {}
    for field, doc in itertools.pairwise(body):
        if not (isinstance(field, ast.AnnAssign) and isinstance(field.target, ast.Name)):
            continue
        if isinstance(doc, ast.Expr) and isinstance(doc.value, ast.Constant):
            found[field.target.id] = " ".join(str(doc.value.value).split())
    return found


def settings_reference() -> str:
    """The README's table of the FSM_* settings, from the fields of Settings."""
    lines = ["| Setting | Default | Meaning |", "| --- | --- | --- |"]
    meanings = descriptions()
    for name, info in config.Settings.model_fields.items():
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
