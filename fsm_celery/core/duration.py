"""Durations as people write them: `30s`, `10m`, `4h`, `2d`, `1h30m`, seconds, or ISO 8601."""

from __future__ import annotations

import re
from collections.abc import Callable
from datetime import timedelta
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError, WrapValidator

UNITS = {"d": 86_400, "h": 3_600, "m": 60, "s": 1}
# Each unit at most once, largest first (`1h30m`, `2d 4h`): `30m1h` is more likely a slip
# than a sum. A number without a unit is seconds.
_UNITS = re.compile(
    r"\s*".join(rf"(?:(?P<{unit}>[0-9]+(?:\.[0-9]+)?)\s*{unit})?" for unit in UNITS),
    re.IGNORECASE,
)
# A bound on the text: a duration is short, and a number of thousands of digits is an attack.
LONGEST_TEXT = 40
EXPECTED = "seconds (300), units s, m, h, d (30s, 10m, 4h, 2d, 1h30m) or ISO 8601 (PT5M)"
_TIMEDELTA: TypeAdapter[timedelta] = TypeAdapter(timedelta)


def units(text: str) -> timedelta | None:
    """The duration a text of units (`1h30m`) or plain seconds (`300`) says, or None."""
    text = text.strip()
    if not text or len(text) > LONGEST_TEXT:
        return None
    if re.fullmatch(r"[0-9]+(?:\.[0-9]+)?", text):
        seconds = float(text)
    else:
        found = _UNITS.fullmatch(text)
        if found is None or not any(found.groupdict().values()):
            return None
        parts = found.groupdict().items()
        seconds = sum(float(v) * UNITS[u.lower()] for u, v in parts if v is not None)
    try:
        return timedelta(seconds=seconds)
    except OverflowError:
        raise ValueError(f"duration {text!r} is too long") from None


def parse_duration(value: Any) -> timedelta:
    """A duration from seconds, units or ISO 8601 (ValueError naming the forms it takes)."""
    return _duration(value, _TIMEDELTA.validate_python)


def _duration(value: Any, handler: Callable[[Any], Any]) -> timedelta:
    if isinstance(value, str):
        found = units(value)
        if found is not None:
            return found
    try:
        result: timedelta = handler(value)
    except ValidationError:
        shown = value[:LONGEST_TEXT] if isinstance(value, str) else value
        raise ValueError(f"a duration is {EXPECTED}, got {shown!r}") from None
    return result


# A definition's duration: pydantic's timedelta (seconds, ISO 8601) and units besides.
Duration = Annotated[timedelta, WrapValidator(_duration)]
