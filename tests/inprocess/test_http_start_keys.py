"""POST /api/machines with a key (the IETF Idempotency-Key header, or the body's `key`): 201 for
a new machine, 200 with the same body for the one the key holds, 422 for a key reused with
another type or context, 400 for a bad key or two keys that differ; the key shown with the
machine."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tests.support.credentials import ADMIN_TOKEN
from tests.support.processes import FsmEnv

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def env(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    return env_factory("http_start_keys")


@pytest.fixture(scope="module")
def http(env: FsmEnv) -> Iterator[Any]:
    with env.api() as client:
        yield client


def _post(http: Any, body: dict[str, Any], key: str | None = None) -> Any:
    headers = ADMIN if key is None else {**ADMIN, "Idempotency-Key": key}
    return http.post("/api/machines", json=body, headers=headers)


def _count(env: FsmEnv, machine_type: str) -> int:
    return len(env.client.list_machines(machine_type=machine_type, limit=1000))


def test_a_repeated_start_is_a_200_with_the_same_body_as_the_201(http: Any, env: FsmEnv) -> None:
    body = {"type": "test_pair", "context": {"order": 1}}
    first = _post(http, body, '"order-1"')  # the draft's form: a structured-field string
    assert first.status_code == 201, first.text
    before = _count(env, "test_pair")
    again = _post(http, body, "order-1")  # the bare text: the same key
    assert again.status_code == 200, again.text
    assert again.json().keys() == first.json().keys()
    assert again.json()["machine"]["id"] == first.json()["machine"]["id"]
    assert again.json()["machine"]["key"] == "order-1"
    assert _count(env, "test_pair") == before


def test_the_body_key_is_the_header_key(http: Any) -> None:
    first = _post(http, {"type": "test_pair", "key": "body-1"})
    assert first.status_code == 201, first.text
    both = _post(http, {"type": "test_pair", "key": "body-1"}, "body-1")
    assert both.status_code == 200, both.text
    assert both.json()["machine"]["id"] == first.json()["machine"]["id"]


def test_the_key_is_shown_with_the_machine(http: Any) -> None:
    started = _post(http, {"type": "test_pair"}, "shown-1").json()["machine"]
    shown = http.get(f"/api/machines/{started['id']}", headers=ADMIN).json()["machine"]
    assert shown["key"] == "shown-1"


def _error(response: Any, status: int, *words: str) -> None:
    assert response.status_code == status, response.text
    message = response.json()["error"]["message"]
    for word in words:
        assert word in message, message


def test_a_key_reused_with_another_type_or_context_is_a_422_naming_the_machine(
    http: Any, env: FsmEnv
) -> None:
    mid = _post(http, {"type": "test_pair", "context": {"a": 1}}, "reused-1").json()["machine"]
    before = _count(env, "test_linear"), _count(env, "test_pair")
    other_type = _post(http, {"type": "test_linear", "context": {"a": 1}}, "reused-1")
    _error(other_type, 422, f"holds machine {mid['id']} (a test_pair)", "another type")
    other_context = _post(http, {"type": "test_pair", "context": {"a": 2}}, "reused-1")
    _error(other_context, 422, "another context")
    assert (_count(env, "test_linear"), _count(env, "test_pair")) == before


@pytest.mark.parametrize(
    ("header", "body_key", "says"),
    [
        ("one", "two", "Idempotency-Key 'one' and the body's key 'two' differ"),
        ('""', None, "Idempotency-Key: start key '': is empty"),
        ("k" * 201, None, "is 201 characters long: at most 200"),
        (None, "a\tb", "key: start key 'a\\tb': holds '\\t'"),
    ],
)
def test_a_bad_key_or_two_keys_are_a_400_and_start_nothing(
    http: Any, env: FsmEnv, header: str | None, body_key: str | None, says: str
) -> None:
    before = _count(env, "test_linear")
    body: dict[str, Any] = {"type": "test_linear"}
    if body_key is not None:
        body["key"] = body_key
    _error(_post(http, body, header), 400, says)
    assert _count(env, "test_linear") == before


def test_a_key_taken_through_another_door_is_the_same_start(http: Any, env: FsmEnv) -> None:
    mid = env.client.start_machine("test_pair", {"via": "python"}, key="doors-1")
    again = _post(http, {"type": "test_pair", "context": {"via": "python"}}, "doors-1")
    assert again.status_code == 200, again.text
    assert again.json()["machine"]["id"] == str(mid)
