"""Wire messages: the seed's JSON, task tokens and the JSON Schemas."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from fsm_celery.core.messages import (
    StateAck,
    StateHeartbeat,
    StateTask,
    message_schemas,
    parse_agent_message,
    task_token,
    token_matches,
)

MACHINE = uuid.UUID("5b1f0c1e-3f7a-4c55-9f0e-7d9f1b6e2a10")
SEED_ACK = {
    "type": "state_ack",
    "machineId": str(MACHINE),
    "state": "WRITE_CODE",
    "success": True,
    "output": {"filesCreated": ["src/index.ts"], "buildSuccess": True, "tokensUsed": 15000},
}


def test_the_seed_ack_parses() -> None:
    ack = parse_agent_message(json.dumps(SEED_ACK))
    assert isinstance(ack, StateAck)
    assert (ack.machine_id, ack.state, ack.success) == (MACHINE, "WRITE_CODE", True)
    assert ack.output["tokensUsed"] == 15000
    assert (ack.attempt, ack.task_token) == (None, None)


def test_a_heartbeat_parses() -> None:
    beat = parse_agent_message(
        json.dumps(
            {
                "type": "state_heartbeat",
                "machineId": str(MACHINE),
                "state": "WRITE_CODE",
                "attempt": 2,
                "taskToken": "t",
                "progress": "3 of 5 files",
            }
        )
    )
    assert isinstance(beat, StateHeartbeat) and beat.progress == "3 of 5 files"


@pytest.mark.parametrize(
    "raw",
    [
        '{"type": "state_ack"',
        '{"type": "state_nack"}',
        "[]",
        json.dumps({**SEED_ACK, "success": "yes"}),
        json.dumps({**SEED_ACK, "attempt": -1}),
    ],
)
def test_bad_messages_raise_validation_errors(raw: str) -> None:
    with pytest.raises(ValidationError):
        parse_agent_message(raw)


def test_state_task_goes_out_in_camel_case() -> None:
    task = StateTask(
        machine_id=MACHINE,
        machine_type="cto_build_project",
        state="WRITE_CODE",
        attempt=4,
        context={"projectName": "sla-api"},
        prompt="Implement it.",
        required_output=["a"],
        timeout=300_000,
        deadline=datetime(2026, 1, 1, tzinfo=UTC),
        task_token="tok",
    )
    wire = json.loads(task.to_wire())
    assert wire["type"] == "state_task"
    assert {"machineId", "machineType", "requiredOutput", "taskToken", "deadline"} <= set(wire)
    assert wire["timeout"] == 300_000


def test_task_token_binds_machine_state_and_attempt() -> None:
    token = task_token("secret", MACHINE, "WRITE_CODE", 4)
    assert token == task_token("secret", MACHINE, "WRITE_CODE", 4)
    others = {
        task_token("secret", uuid.uuid4(), "WRITE_CODE", 4),
        task_token("secret", MACHINE, "RUN_TESTS", 4),
        task_token("secret", MACHINE, "WRITE_CODE", 5),
        task_token("other", MACHINE, "WRITE_CODE", 4),
    }
    assert token not in others and len(others) == 4


def test_token_matches_only_the_issued_token() -> None:
    token = task_token("s", MACHINE, "WRITE_CODE", 4)
    good = StateAck.model_validate_json(json.dumps({**SEED_ACK, "attempt": 4, "taskToken": token}))
    assert token_matches("s", good, 4)
    assert not token_matches("s", good, 5)
    assert not token_matches("wrong", good, 4)
    assert not token_matches("s", StateAck.model_validate_json(json.dumps(SEED_ACK)), 4)


def test_every_message_has_a_schema_with_wire_names() -> None:
    schemas = message_schemas()
    assert set(schemas) == {"state_task", "state_ack", "state_heartbeat", "agent_status"}
    assert "machineId" in schemas["state_ack"]["properties"]
    assert "taskToken" in schemas["state_task"]["required"]


def test_the_published_schemas_are_current() -> None:
    from pathlib import Path

    from fsm_celery.core.messages import schemas_json

    published = Path(__file__).resolve().parents[2] / "docs" / "schemas.json"
    assert published.read_text().strip() == schemas_json().strip(), (
        "docs/schemas.json is stale: run fsm-celery schema > docs/schemas.json"
    )
