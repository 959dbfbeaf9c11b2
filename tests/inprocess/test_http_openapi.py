"""The API's commands take no body when every field is optional, and its OpenAPI document shows
an example of each request body and each answer, with the keys the API really answers."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from fsm_celery.http import examples
from tests.support.credentials import ADMIN_TOKEN
from tests.support.processes import FsmEnv

ADMIN = {"Authorization": f"Bearer {ADMIN_TOKEN}"}


@pytest.fixture(scope="module")
def env(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    return env_factory("http_openapi")


@pytest.fixture(scope="module")
def http(env: FsmEnv) -> Iterator[Any]:
    with env.api() as client:
        yield client


@pytest.fixture(scope="module")
def document(http: Any) -> dict[str, Any]:
    found: dict[str, Any] = http.get("/openapi.json").json()
    return found


def _start(http: Any) -> str:
    started = http.post("/api/machines", json={"type": "test_linear"}, headers=ADMIN)
    assert started.status_code == 201, started.text
    return str(started.json()["machine"]["id"])


def test_commands_and_budget_take_no_body(http: Any, env: FsmEnv) -> None:
    machine_id = _start(http)
    for action, status in [("pause", "paused"), ("resume", "running"), ("cancel", "cancelled")]:
        done = http.post(f"/api/machines/{machine_id}/{action}", headers=ADMIN)
        assert done.status_code == 200, done.text
        assert done.json()["machine"]["status"] == status
    retried = http.post(f"/api/machines/{_start(http)}/retry", headers=ADMIN)
    assert retried.status_code == 200, retried.text
    other = _start(http)
    http.put(f"/api/machines/{other}/budget", json={"tokens": 5}, headers=ADMIN)
    cleared = http.put(f"/api/machines/{other}/budget", headers=ADMIN)
    assert cleared.status_code == 200 and cleared.json()["machine"]["budget_tokens"] is None
    schedule = env.client.schedules()[0].key
    paused = http.post(f"/api/schedules/{schedule}/pause", headers=ADMIN)
    assert paused.status_code == 200 and paused.json()["schedule"]["paused"] is True
    http.post(f"/api/schedules/{schedule}/resume", headers=ADMIN)
    events = [h.event for h in env.client.history(machine_id)]
    assert events[-3:] == ["pause", "resume", "cancel"]


def test_a_body_is_still_checked_when_one_is_sent(http: Any) -> None:
    machine_id = _start(http)
    refused = http.post(f"/api/machines/{machine_id}/pause", json={"nope": 1}, headers=ADMIN)
    assert refused.status_code == 422 and "nope" in refused.json()["error"]["message"]
    bad = http.post(
        f"/api/machines/{machine_id}/pause",
        content=b"{",
        headers={**ADMIN, "content-type": "application/json"},
    )
    assert bad.status_code == 400


def _schema(document: dict[str, Any], body: dict[str, Any]) -> dict[str, Any]:
    """The schema a request body names (through $ref and `X | None`)."""
    schema: dict[str, Any] = body["content"]["application/json"]["schema"]
    for option in schema.get("anyOf", [schema]):
        if "$ref" in option:
            name = option["$ref"].rsplit("/", 1)[1]
            found: dict[str, Any] = document["components"]["schemas"][name]
            return found
    return schema


def test_every_operation_shows_an_example_of_its_body_and_answer(
    document: dict[str, Any],
) -> None:
    missing = []
    for path, operations in document["paths"].items():
        if not path.startswith("/api"):
            continue
        for method, operation in operations.items():
            body = operation.get("requestBody")
            if body is not None and not _schema(document, body).get("examples"):
                missing.append(f"{method} {path}: request body")
            answer = operation["responses"].get("200") or operation["responses"].get("201")
            if not any("example" in c for c in answer.get("content", {}).values()):
                missing.append(f"{method} {path}: answer")
    assert not missing


def test_optional_bodies_are_documented_as_optional(document: dict[str, Any]) -> None:
    pause = document["paths"]["/api/machines/{machine_id}/pause"]["post"]
    assert not pause["requestBody"].get("required", False)
    start = document["paths"]["/api/machines"]["post"]
    assert start["requestBody"]["required"] is True


def test_the_examples_have_the_keys_the_api_answers(http: Any) -> None:
    machine_id = _start(http)
    http.put(f"/api/machines/{machine_id}/budget", json={"tokens": 9}, headers=ADMIN)
    shown = http.get(f"/api/machines/{machine_id}", headers=ADMIN).json()
    assert shown.keys() == examples.ANSWERS["get_machine"].keys()
    assert shown["machine"].keys() == examples.MACHINE.keys()
    assert shown["history"][0].keys() == examples.HISTORY_ROW.keys()
    assert shown["budget_changes"][0].keys() == examples.BUDGET_CHANGE.keys()
    replayed = http.get(f"/api/machines/{machine_id}/replay", headers=ADMIN).json()
    assert replayed.keys() == examples.ANSWERS["replay"].keys()
    assert replayed["steps"][0].keys() == examples.ANSWERS["replay"]["steps"][0].keys()
    assert replayed["outcome"] == "same" and replayed["against"] == "v1"
    missing = http.get(f"/api/machines/{machine_id}/replay?version=9", headers=ADMIN)
    assert missing.status_code == 404 and "has no version 9" in missing.text
    listed = http.get("/api/machines", headers=ADMIN).json()
    assert listed.keys() == examples.ANSWERS["list_machines"].keys()
    schedules = http.get("/api/schedules", headers=ADMIN).json()["items"]
    assert schedules[0].keys() == examples.SCHEDULE.keys()
    definitions = http.get("/api/definitions", headers=ADMIN).json()["items"]
    assert definitions[0].keys() == examples.ANSWERS["list_definitions"]["items"][0].keys()
    one = http.get("/api/definitions/test_linear", headers=ADMIN).json()
    assert one.keys() == examples.ANSWERS["get_definition"].keys()
    stats = http.get("/api/stats", headers=ADMIN).json()
    assert stats.keys() == examples.ANSWERS["stats"].keys()
