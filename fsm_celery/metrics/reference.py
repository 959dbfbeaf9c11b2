"""docs/operations.md's table of every metric (`make docs`), made from the catalog: its name,
kind, labels, who serves it and what it counts."""

from __future__ import annotations

from pathlib import Path

from fsm_celery.metrics.catalog import METRICS, Where

OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "operations.md"
BEGIN, END = "<!-- metrics:begin -->\n", "<!-- metrics:end -->"


def metrics_reference() -> str:
    """The table, per-process metrics first, then the dashboard's fleet-wide gauges."""
    lines = ["| Metric | Type | Labels | Served by | What |", "| --- | --- | --- | --- | --- |"]
    for where in (Where.PROCESS, Where.FLEET):
        for m in (m for m in METRICS if m.where is where):
            labels = ", ".join(f"`{label}`" for label in m.labels) or "—"
            served = "dashboard (`GET /metrics`)" if where is Where.FLEET else m.served_by
            lines.append(f"| `{m.name}` | {m.kind.value} | {labels} | {served} | {m.help} |")
    return "\n".join(lines) + "\n"


def write_reference(page: Path = OPERATIONS) -> bool:
    """Put the table between the page's metrics markers; whether it changed."""
    text = page.read_text()
    head, found, rest = text.partition(BEGIN)
    if not found:
        raise SystemExit(f"{page} has no {BEGIN.strip()} marker")
    _, _, tail = rest.partition(END)
    updated = head + BEGIN + metrics_reference() + END + tail
    page.write_text(updated)
    return updated != text


if __name__ == "__main__":  # make docs
    write_reference()
