"""What the CLI prints: agents' text made harmless to a terminal, durations for people, tables
with a header, and the id prefixes a machine may be named by."""

from __future__ import annotations

from uuid import UUID

import pytest

from fsm_celery.store.reads import id_range
from fsm_celery.terminal import duration, safe, table

ATTACK = "\x1b]0;pwned\x07\x1b[2J\x9b31m\u202egnp.exe\u2066x\u2069\x7f\r\n\tend"


def test_safe_shows_every_control_character_as_a_visible_escape() -> None:
    shown = safe(ATTACK)
    assert shown == (
        "\\x1b]0;pwned\\x07\\x1b[2J\\x9b31m\\u202egnp.exe\\u2066x\\u2069\\x7f\\x0d\\x0a\\x09end"
    )
    assert shown.isprintable()


@pytest.mark.parametrize("code", [*range(0x20), 0x7F, *range(0x80, 0xA0), *range(0x202A, 0x202F)])
def test_safe_leaves_no_control_or_override_character(code: int) -> None:
    assert chr(code) not in safe(f"a{chr(code)}b")


def test_safe_keeps_ordinary_text_as_it_is() -> None:
    text = "ANALYZE_BUG -> LOCATE_CODE: café, 日本語, naïve — 42 % \\ done"
    assert safe(text) == text


@pytest.mark.parametrize(
    ("ms", "shown"),
    [
        (None, ""),
        (-5, "0 ms"),
        (0, "0 ms"),
        (850, "850 ms"),
        (1_234, "1.2 s"),
        (59_949, "59.9 s"),
        (59_960, "1 min"),
        (200_000, "3 min 20 s"),
        (362_375, "6 min 2 s"),
        (3_600_000, "1 h"),
        (14_460_000, "4 h 1 min"),
        (2 * 86_400_000 + 3 * 3_600_000 + 59_000, "2 d 3 h"),
    ],
)
def test_duration_reads_as_people_say_it(ms: int | None, shown: str) -> None:
    assert duration(ms) == shown


def test_table_aligns_cells_under_a_header_and_escapes_them() -> None:
    lines = table(["ID", "ERROR"], [["abc", "\x1b[2J"], ["a", None]])
    assert lines == ["ID   ERROR", "abc  \\x1b[2J", "a    -"]


@pytest.mark.parametrize(
    ("prefix", "low", "high"),
    [
        (
            "abcd",
            "abcd0000-0000-0000-0000-000000000000",
            "abcdffff-ffff-ffff-ffff-ffffffffffff",
        ),
        (
            "ABCD1234-5",
            "abcd1234-5000-0000-0000-000000000000",
            "abcd1234-5fff-ffff-ffff-ffffffffffff",
        ),
    ],
)
def test_an_id_prefix_is_the_range_of_ids_that_start_with_it(
    prefix: str, low: str, high: str
) -> None:
    assert id_range(prefix) == (UUID(low), UUID(high))


@pytest.mark.parametrize("prefix", ["", "xyz1", "abcd%", "a" * 33, "ab cd"])
def test_what_is_not_hex_is_no_id_prefix(prefix: str) -> None:
    assert id_range(prefix) is None
