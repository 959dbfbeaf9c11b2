"""What the command line prints, made safe and readable (pure): text from agents and other
callers with its control characters shown as escapes, durations for people (the dashboard's
pages use the same), aligned tables.

An agent's progress, error, output or context may hold a terminal's escape sequences
(`ESC ] 0 ; title BEL` retitles the window, `ESC [ 2 J` clears it, others rewrite the lines an
operator reads) or bidi overrides that show text in an order other than its own. Everything the
CLI prints in a table or a field goes through `safe`, which shows each such character as a
visible escape (`\\x1b`, `\\u202e`) instead.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

# C0 (newline and tab too: a cell is one line), DEL and C1
_CONTROLS = [*range(0x00, 0x20), 0x7F, *range(0x80, 0xA0)]
# bidi embeddings, overrides and isolates; marks; line and paragraph separators
_FORMATS = [0x061C, 0x200E, 0x200F, 0x2028, 0x2029, *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_ESCAPES = {c: f"\\x{c:02x}" for c in _CONTROLS} | {c: f"\\u{c:04x}" for c in _FORMATS}


def safe(text: object) -> str:
    """The text as one line a terminal shows as it is: control characters, escape sequences
    and bidi overrides shown as escapes (\\x1b, \\u202e)."""
    return str(text).translate(_ESCAPES)


def duration(ms: float | None) -> str:
    """A duration for people: 850 ms, 1.2 s, 3 min 20 s, 4 h 1 min, 2 d 3 h ('' for none).

    The dashboard's pages write it the same way (static/dashboard.js too): halves round up, in
    whole numbers, as the script's arithmetic does."""
    if ms is None:
        return ""
    ms = max(0, int(ms + 0.5))
    if ms < 1000:
        return f"{ms} ms"
    if ms < 59_950:
        tenths = (ms + 50) // 100
        return f"{tenths // 10}.{tenths % 10} s"
    seconds = (ms + 500) // 1000
    for unit, size, smaller, rest in (("d", 86400, "h", 3600), ("h", 3600, "min", 60)):
        if seconds >= size:
            return _pair(seconds // size, unit, seconds % size // rest, smaller)
    return _pair(seconds // 60, "min", seconds % 60, "s")


def _pair(big: int, big_unit: str, small: int, small_unit: str) -> str:
    return f"{big} {big_unit}" + (f" {small} {small_unit}" if small else "")


def table(header: Sequence[str], rows: Iterable[Sequence[object]]) -> list[str]:
    """The rows under their header as aligned columns, every cell made `safe` (None: '-')."""
    cells = [list(header)] + [["-" if c is None else safe(c) for c in row] for row in rows]
    widths = [max(map(len, column)) for column in zip(*cells, strict=True)]
    return ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells]
