"""Wire messages: the seed's camelCase JSON, task tokens and the JSON Schemas."""

from __future__ import annotations

import json
import re
import uuid
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from fsm_celery.core.messages import (
    AgentStatus,
    StateAck,
    StateCancel,
    StateHandBack,
    StateHeartbeat,
    StateTask,
    message_schemas,
    parse_agent_message,
    parse_task_message,
    schemas_json,
    task_token,
    token_matches,
    unstorable,
)

MACHINE = uuid.UUID("5b1f0c1e-3f7a-4c55-9f0e-7d9f1b6e2a10")
OTHER_MACHINE = uuid.UUID("0d6f1c2e-8a4b-4f3e-9b1a-2c3d4e5f6a7b")
SECRET = "s3cret"
CAMEL = re.compile(r"^[a-z][A-Za-z0-9]*$")

# The seed's example ack, as a seed-era agent sends it: no attempt, no token.
SEED_ACK = {
    "type": "state_ack",
    "machineId": str(MACHINE),
    "state": "WRITE_CODE",
    "success": True,
    "output": {"filesCreated": ["src/index.ts"], "buildSuccess": True, "tokensUsed": 15000},
}


def task(**changes: Any) -> StateTask:
    fields: dict[str, Any] = {
        "machine_id": MACHINE,
        "machine_type": "cto_build_project",
        "state": "WRITE_CODE",
        "attempt": 4,
        "context": {"projectName": "sla-api", "retryCount": 0},
        "prompt": "Implement it.",
        "required_output": ["filesCreated"],
        "timeout": 1_800_000,
        "deadline": datetime(2026, 1, 1, 12, 30, tzinfo=UTC),
        "task_token": "tok",
    }
    return StateTask(**{**fields, **changes})


def signed_ack(attempt: int, token: str | None, state: str = "WRITE_CODE") -> StateAck:
    raw = {**SEED_ACK, "state": state, "attempt": attempt, "taskToken": token}
    return StateAck.model_validate_json(json.dumps(raw))


# -- acks and heartbeats ----------------------------------------------------------------------


def test_state_ack_parses_the_seed_example() -> None:
    ack = StateAck.model_validate_json(json.dumps(SEED_ACK))
    assert (ack.type, ack.machine_id, ack.state, ack.success) == (
        "state_ack",
        MACHINE,
        "WRITE_CODE",
        True,
    )
    assert ack.output == SEED_ACK["output"]
    assert (ack.attempt, ack.task_token, ack.error) == (None, None, None)


def test_parse_agent_message_recognises_the_seed_ack() -> None:
    assert parse_agent_message(json.dumps(SEED_ACK)) == StateAck.model_validate_json(
        json.dumps(SEED_ACK)
    )


def test_ack_carries_attempt_token_and_error_in_camel_case() -> None:
    raw = {**SEED_ACK, "success": False, "attempt": 4, "taskToken": "t", "error": "tsc failed"}
    ack = parse_agent_message(json.dumps(raw))
    assert isinstance(ack, StateAck)
    assert (ack.success, ack.attempt, ack.task_token, ack.error) == (False, 4, "t", "tsc failed")


def test_ack_without_output_has_an_empty_output() -> None:
    raw = {k: v for k, v in SEED_ACK.items() if k != "output"}
    assert StateAck.model_validate_json(json.dumps(raw)).output == {}


def test_ack_ignores_unknown_fields() -> None:
    ack = StateAck.model_validate_json(json.dumps({**SEED_ACK, "agentVersion": "1.2"}))
    assert ack.state == "WRITE_CODE"


def test_heartbeat_parses() -> None:
    raw = {
        "type": "state_heartbeat",
        "machineId": str(MACHINE),
        "state": "WRITE_CODE",
        "attempt": 2,
        "taskToken": "t",
        "progress": "3 of 5 files",
    }
    beat = parse_agent_message(json.dumps(raw))
    assert isinstance(beat, StateHeartbeat)
    assert (beat.attempt, beat.task_token, beat.progress) == (2, "t", "3 of 5 files")


def test_agent_status_parses() -> None:
    raw = {
        "type": "agent_status",
        "agentId": str(OTHER_MACHINE),
        "agentType": "cto",
        "status": "active",
        "concurrency": 4,
    }
    status = parse_agent_message(json.dumps(raw))
    assert isinstance(status, AgentStatus)
    assert (status.agent_type, status.concurrency, status.running) == ("cto", 4, 0)


@pytest.mark.parametrize(
    "raw",
    [
        '{"type": "state_ack"',  # not JSON
        "[]",
        json.dumps({**SEED_ACK, "type": "state_nack"}),
        json.dumps({k: v for k, v in SEED_ACK.items() if k != "success"}),
        json.dumps({**SEED_ACK, "machineId": "not-a-uuid"}),
        json.dumps({**SEED_ACK, "success": "yes"}),  # strict: not a boolean
        json.dumps({**SEED_ACK, "attempt": "3"}),  # strict: not an integer
        json.dumps({**SEED_ACK, "attempt": -1}),
        json.dumps({**SEED_ACK, "state": "S" * 51}),
        json.dumps({**SEED_ACK, "output": ["not", "a", "mapping"]}),
    ],
    ids=[
        "truncated",
        "array",
        "unknown-type",
        "no-success",
        "bad-uuid",
        "string-bool",
        "string-attempt",
        "negative-attempt",
        "long-state",
        "list-output",
    ],
)
def test_malformed_messages_raise_validation_errors(raw: str) -> None:
    with pytest.raises(ValidationError):
        parse_agent_message(raw)


# -- tasks ------------------------------------------------------------------------------------


def test_state_task_goes_out_with_camel_case_keys() -> None:
    wire = json.loads(task().to_wire())
    assert set(wire) == {
        "type",
        "machineId",
        "machineType",
        "state",
        "attempt",
        "context",
        "prompt",
        "requiredOutput",
        "timeout",
        "deadline",
        "taskToken",
    }
    assert wire["type"] == "state_task"
    assert wire["machineId"] == str(MACHINE)
    assert wire["requiredOutput"] == ["filesCreated"]
    assert wire["timeout"] == 1_800_000  # milliseconds, as in the seed


def test_state_task_leaves_context_keys_as_they_are() -> None:
    wire = json.loads(task(context={"project_name": "x", "retryCount": 1}).to_wire())
    assert wire["context"] == {"project_name": "x", "retryCount": 1}


def test_state_task_sends_heartbeat_timeout_only_when_set() -> None:
    assert "heartbeatTimeout" not in json.loads(task().to_wire())
    assert json.loads(task(heartbeat_timeout=60_000).to_wire())["heartbeatTimeout"] == 60_000


def test_state_task_round_trips_through_the_wire() -> None:
    sent = task(heartbeat_timeout=60_000)
    assert StateTask.model_validate_json(sent.to_wire()) == sent


# -- task tokens ------------------------------------------------------------------------------


def test_task_token_is_deterministic() -> None:
    token = task_token(SECRET, MACHINE, "WRITE_CODE", 4)
    assert token == task_token(SECRET, MACHINE, "WRITE_CODE", 4)
    assert re.fullmatch(r"[0-9a-f]{64}", token)


def test_task_token_is_the_same_for_a_uuid_and_its_text() -> None:
    assert task_token(SECRET, MACHINE, "WRITE_CODE", 4) == task_token(
        SECRET, str(MACHINE), "WRITE_CODE", 4
    )


@pytest.mark.parametrize(
    "changed",
    [
        (SECRET, OTHER_MACHINE, "WRITE_CODE", 4),
        (SECRET, MACHINE, "RUN_TESTS", 4),
        (SECRET, MACHINE, "WRITE_CODE", 5),
        ("other-secret", MACHINE, "WRITE_CODE", 4),
    ],
    ids=["machine", "state", "attempt", "secret"],
)
def test_task_token_changes_with_machine_state_attempt_and_secret(
    changed: tuple[str, uuid.UUID, str, int],
) -> None:
    assert task_token(*changed) != task_token(SECRET, MACHINE, "WRITE_CODE", 4)


def test_token_matches_the_issued_token() -> None:
    ack = signed_ack(4, task_token(SECRET, MACHINE, "WRITE_CODE", 4))
    assert token_matches([SECRET], ack, 4)


def test_token_matches_rejects_a_forged_token() -> None:
    assert not token_matches([SECRET], signed_ack(4, "0" * 64), 4)


def test_token_matches_rejects_a_missing_token() -> None:
    assert not token_matches([SECRET], StateAck.model_validate_json(json.dumps(SEED_ACK)), 4)


def test_token_matches_rejects_another_attempts_token() -> None:
    ack = signed_ack(4, task_token(SECRET, MACHINE, "WRITE_CODE", 3))
    assert not token_matches([SECRET], ack, 4)


def test_token_matches_rejects_the_token_checked_for_another_attempt() -> None:
    ack = signed_ack(4, task_token(SECRET, MACHINE, "WRITE_CODE", 4))
    assert not token_matches([SECRET], ack, 5)


def test_token_matches_rejects_a_token_issued_for_another_state() -> None:
    ack = signed_ack(4, task_token(SECRET, MACHINE, "RUN_TESTS", 4), state="WRITE_CODE")
    assert not token_matches([SECRET], ack, 4)


def test_token_matches_rejects_a_token_signed_with_another_secret() -> None:
    ack = signed_ack(4, task_token("other-secret", MACHINE, "WRITE_CODE", 4))
    assert not token_matches([SECRET], ack, 4)


def test_token_matches_checks_heartbeats_too() -> None:
    raw = {
        "type": "state_heartbeat",
        "machineId": str(MACHINE),
        "state": "WRITE_CODE",
        "attempt": 4,
        "taskToken": task_token(SECRET, MACHINE, "WRITE_CODE", 4),
    }
    beat = StateHeartbeat.model_validate_json(json.dumps(raw))
    assert token_matches([SECRET], beat, 4)
    assert not token_matches([SECRET], beat, 3)


def test_a_task_stream_holds_state_tasks_and_state_cancels() -> None:
    token = task_token(SECRET, MACHINE, "WRITE_CODE", 4)
    cancel = StateCancel(
        machine_id=MACHINE, state="WRITE_CODE", attempt=4, task_token=token, reason="pause by al"
    )
    assert parse_task_message(cancel.to_wire()) == cancel
    assert json.loads(cancel.to_wire())["type"] == "state_cancel"
    seed_style = {  # the seed's tasks carry no type: still a state_task
        "machineId": str(MACHINE),
        "machineType": "cto_build_project",
        "state": "WRITE_CODE",
        "attempt": 4,
        "context": {},
        "prompt": "",
        "requiredOutput": [],
        "timeout": 1000,
        "deadline": "2999-01-01T00:00:00Z",
        "taskToken": token,
    }
    assert isinstance(parse_task_message(json.dumps(seed_style)), StateTask)


def test_an_unknown_task_message_type_is_refused_by_name() -> None:
    with pytest.raises(ValidationError, match="'state_unknown'"):
        parse_task_message('{"type": "state_unknown", "machineId": "x"}')


# -- JSON Schemas -----------------------------------------------------------------------------


def test_schemas_cover_every_message_type() -> None:
    assert set(message_schemas()) == {
        "state_task",
        "state_cancel",
        "state_ack_refused",
        "state_ack",
        "state_heartbeat",
        "state_handback",
        "agent_status",
        "state_event",
    }


@pytest.mark.parametrize(
    "message",
    [
        "state_task",
        "state_cancel",
        "state_ack_refused",
        "state_ack",
        "state_handback",
        "state_event",
    ],
)
def test_schema_property_names_are_camel_case(message: str) -> None:
    schema = message_schemas()[message]
    names = list(schema["properties"]) + list(schema["required"])
    assert [n for n in names if not CAMEL.match(n)] == []
    assert "machineId" in schema["properties"]


def test_state_task_schema_requires_what_the_engine_always_sends() -> None:
    assert set(message_schemas()["state_task"]["required"]) == {
        "machineId",
        "machineType",
        "state",
        "attempt",
        "context",
        "prompt",
        "requiredOutput",
        "timeout",
        "deadline",
        "taskToken",
    }


def test_state_ack_schema_requires_only_the_seeds_fields() -> None:
    assert set(message_schemas()["state_ack"]["required"]) == {
        "type",
        "machineId",
        "state",
        "success",
    }


def test_the_published_schemas_are_current() -> None:
    # The one read outside definitions/: docs/schemas.json must match the code.
    published = Path(__file__).resolve().parents[2] / "docs" / "schemas.json"
    assert published.read_text().strip() == schemas_json().strip(), (
        "docs/schemas.json is stale: run fsm-celery schema > docs/schemas.json"
    )


@pytest.mark.parametrize(
    ("raw_output", "expected"),
    [
        ('{"log": "build failed", "n": 3, "x": 1.5}', None),
        ('{"log": "build\\u0000failed"}', "message.output.log: holds a NUL character"),
        ('{"bad\\u0000key": 1}', "message.output key: holds a NUL character"),
        ('{"lines": ["ok", {"deep": "x\\u0000"}]}', "message.output.lines[1].deep: holds a NUL"),
        ('{"text": "a backslash and u0000: \\\\u0000"}', None),
        ('{"ratio": NaN}', "message.output.ratio: nan is not a finite number"),
        ('{"cost": Infinity}', "message.output.cost: inf is not a finite number"),
        ('{"cost": -Infinity}', "message.output.cost: -inf is not a finite number"),
        ('{"huge": 1e400}', "message.output.huge: inf is not a finite number"),
        ('{"tokensUsed": 9223372036854775808}', "message.output.tokensUsed: 92233720368547"),
        ('{"tokensUsed": 9223372036854775807}', None),
        ('{"flag": true}', None),
    ],
    ids=[
        "plain",
        "nul-in-a-value",
        "nul-in-a-key",
        "nul-nested",
        "escaped-text",
        "nan",
        "infinity",
        "minus-infinity",
        "1e400",
        "past-bigint",
        "bigint-max",
        "bool",
    ],
)
def test_values_postgresql_refuses_are_found_wherever_they_are(
    raw_output: str, expected: str | None
) -> None:
    raw = (
        f'{{"type": "state_ack", "machineId": "{uuid.uuid4()}", "state": "S", "success": true, '
        f'"output": {raw_output}}}'
    )
    found = unstorable(parse_agent_message(raw).model_dump(), "message")
    if expected is None:
        assert found is None
    else:
        assert found is not None and found.startswith(expected)


@pytest.mark.parametrize("attempt", [2**31, 2**40, 2**63, -1])
def test_an_attempt_outside_its_column_breaks_the_schema(attempt: int) -> None:
    with pytest.raises(ValidationError, match="attempt"):
        parse_agent_message(json.dumps({**SEED_ACK, "attempt": attempt, "taskToken": "t"}))


def test_an_agent_status_with_a_concurrency_past_its_column_breaks_the_schema() -> None:
    status = {
        "type": "agent_status",
        "agentId": str(uuid.uuid4()),
        "agentType": "cto",
        "status": "active",
        "concurrency": 2**40,
    }
    with pytest.raises(ValidationError, match="concurrency"):
        parse_agent_message(json.dumps(status))


def test_a_hand_back_parses_and_needs_its_attempt_and_token() -> None:
    back = {
        "type": "state_handback",
        "machineId": str(MACHINE),
        "state": "WRITE_CODE",
        "attempt": 4,
        "taskToken": "t",
        "reason": "shutting down",
    }
    parsed = parse_agent_message(json.dumps(back))
    assert isinstance(parsed, StateHandBack)
    assert (parsed.attempt, parsed.reason) == (4, "shutting down")
    with pytest.raises(ValidationError, match="taskToken"):
        parse_agent_message(json.dumps({k: v for k, v in back.items() if k != "taskToken"}))


def test_a_token_signed_with_a_secret_being_rotated_out_still_matches() -> None:
    ack = signed_ack(4, task_token("old-secret", MACHINE, "WRITE_CODE", 4))
    assert token_matches(["new-secret", "old-secret"], ack, 4)
    assert not token_matches(["new-secret"], ack, 4)
