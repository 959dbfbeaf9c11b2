"""A start's key: which keys a start may hold, the context's digest (canonical JSON), what a
repeated start must ask the same, and how the HTTP door reads the key it is given."""

from __future__ import annotations

import hashlib
import uuid

import pytest
from fastapi import HTTPException
from hypothesis import given
from hypothesis import strategies as st

from fsm_celery.core.start_key import (
    KEY_CHARS,
    KeyedStart,
    checked_key,
    context_digest,
    differences,
)
from fsm_celery.exceptions import InvalidStartKey, StartKeyReused
from fsm_celery.http.starts import given_key

AGENT = uuid.UUID("6b0d1c9e-2f4a-4c39-9d5e-8a7b6c5d4e3f")


@pytest.mark.parametrize(
    "key",
    ["k", "x" * KEY_CHARS, "order 42 / retry", "schedule:t/n:2026-03-02T12:00:00+00:00", "clé-ü"],
)
def test_a_key_of_1_to_200_printable_characters_is_taken_as_it_is(key: str) -> None:
    assert checked_key(key) == key


@pytest.mark.parametrize(
    ("key", "says"),
    [
        ("", "is empty"),
        ("x" * (KEY_CHARS + 1), "is 201 characters long: at most 200"),
        ("a\nb", r"holds '\n'"),
        ("a\x00b", r"holds '\x00'"),
        ("tab\there", r"holds '\t'"),
        ("bidi\u202eflip", r"holds '\u202e'"),
        (42, "must be text, got int"),
    ],
)
def test_a_bad_key_is_refused_naming_it_and_what_is_wrong(key: object, says: str) -> None:
    with pytest.raises(InvalidStartKey) as refused:
        checked_key(key)
    assert says in str(refused.value)
    assert str(refused.value).startswith("start key ")


def test_the_digest_is_the_sha256_of_canonical_json() -> None:
    expected = hashlib.sha256(b'{"a":1,"b":["x",{"c":null}],"d":"\xc3\xa9"}').hexdigest()
    assert context_digest({"d": "é", "b": ["x", {"c": None}], "a": 1}) == expected


def test_the_digest_ignores_key_order_and_how_a_whole_number_was_written() -> None:
    assert context_digest({"a": 1, "b": {"y": 2, "x": 1}}) == context_digest(
        {"b": {"x": 1.0, "y": 2}, "a": 1.0}
    )


@pytest.mark.parametrize(
    "other",
    [{"a": 2}, {"a": "1"}, {"a": 1, "b": None}, {"a": [1]}, {"A": 1}, {"a": 1.5}, {}],
)
def test_a_different_context_has_a_different_digest(other: dict[str, object]) -> None:
    assert context_digest({"a": 1}) != context_digest(other)


@given(st.dictionaries(st.text(max_size=5), st.integers() | st.text(max_size=5), max_size=6))
def test_the_digest_does_not_depend_on_insertion_order(context: dict[str, object]) -> None:
    reversed_order = dict(reversed(list(context.items())))
    assert context_digest(context) == context_digest(reversed_order)


def _asked(**changes: object) -> KeyedStart:
    fields: dict[str, object] = {
        "key": "k",
        "machine_type": "cto_fix_bug",
        "context_digest": context_digest({"a": 1}),
        "agent_id": AGENT,
        "github_issue": 7,
    }
    return KeyedStart(**(fields | changes))  # type: ignore[arg-type]


def test_the_same_start_differs_in_nothing() -> None:
    assert differences(_asked(), _asked()) == []


@pytest.mark.parametrize(
    ("changes", "differs"),
    [
        ({"machine_type": "cto_build_project"}, ["type"]),
        ({"context_digest": context_digest({"a": 2})}, ["context"]),
        ({"agent_id": None}, ["agent"]),
        ({"github_issue": 8}, ["github issue"]),
        ({"machine_type": "x", "context_digest": "0" * 64}, ["type", "context"]),
    ],
)
def test_a_start_that_asks_otherwise_differs_in_what_it_changed(
    changes: dict[str, object], differs: list[str]
) -> None:
    assert differences(_asked(), _asked(**changes)) == differs


def test_a_reused_key_names_the_machine_that_holds_it_and_what_differs() -> None:
    refused = StartKeyReused("k", "3f2b", "cto_fix_bug", ["type", "context"])
    assert str(refused).startswith(
        "start key 'k' holds machine 3f2b (a cto_fix_bug), started with another type and "
        "another context"
    )
    assert refused.differs == ("type", "context")


@pytest.mark.parametrize(
    ("header", "field", "key"),
    [
        (None, None, None),
        ("abc", None, "abc"),
        ('"abc"', None, "abc"),
        ('"a \\"quoted\\" \\\\ key"', None, 'a "quoted" \\ key'),
        (None, "abc", "abc"),
        ('"abc"', "abc", "abc"),
    ],
)
def test_the_http_key_comes_from_the_header_or_the_body(
    header: str | None, field: str | None, key: str | None
) -> None:
    assert given_key(header, field) == key


@pytest.mark.parametrize(
    ("header", "field", "says"),
    [
        ("abc", "abd", "Idempotency-Key 'abc' and the body's key 'abd' differ"),
        ('""', None, "Idempotency-Key: start key '': is empty"),
        ("x" * 201, None, "Idempotency-Key: start key"),
        (None, "a\x07", r"key: start key 'a\x07': holds '\x07'"),
        ('"abc\\"', None, "ends in a lone backslash"),
    ],
)
def test_a_bad_or_doubled_http_key_is_a_400(
    header: str | None, field: str | None, says: str
) -> None:
    with pytest.raises(HTTPException) as refused:
        given_key(header, field)
    assert refused.value.status_code == 400
    assert says in str(refused.value.detail)
