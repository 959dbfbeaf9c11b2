"""The Python API and the CLI against a real database: bad input is refused and writes nothing."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from fsm_celery import cli
from fsm_celery.api import default_client
from fsm_celery.config import get_settings
from fsm_celery.core.loader import load_file
from fsm_celery.core.messages import ack_channel
from fsm_celery.exceptions import (
    ContextMismatch,
    InvalidContext,
    MachineNotFound,
    UnknownMachineType,
)
from tests.integration.conftest import ONE_MODE
from tests.support import ROOT
from tests.support.agents import ScriptedAgent
from tests.support.messages import SILENT
from tests.support.processes import FsmEnv

CLI_CONTEXT = '{"projectName": "sla-api", "githubIssue": 5}'


@pytest.fixture
def run(fsm: FsmEnv, monkeypatch: pytest.MonkeyPatch) -> Iterator[object]:
    """Invoke the CLI as its users do: its client built from FSM_* environment variables (the
    shared deployment's), through fsm_celery.wiring, as in `fsm-celery` itself."""
    for name, value in fsm.env.items():
        if name.startswith("FSM_"):
            monkeypatch.setenv(name, value)
    get_settings.cache_clear()
    default_client.cache_clear()

    def invoke(*args: str) -> Result:
        return CliRunner().invoke(cli.main, list(args))

    yield invoke
    if default_client.cache_info().currsize:
        default_client().engine.db.dispose()
    default_client.cache_clear()
    get_settings.cache_clear()


def _machine_count(env: FsmEnv) -> int:
    return sum(sum(by_status.values()) for by_status in env.client.stats()["machines"].values())


@ONE_MODE
def test_start_with_an_unknown_type_is_refused_and_writes_nothing(fsm: FsmEnv) -> None:
    before = _machine_count(fsm)
    with pytest.raises(UnknownMachineType, match="cto_build_spaceship"):
        fsm.client.start_machine("cto_build_spaceship", {})
    assert _machine_count(fsm) == before


@ONE_MODE
def test_start_with_a_context_that_is_not_an_object_is_refused(fsm: FsmEnv) -> None:
    before = _machine_count(fsm)
    with pytest.raises(InvalidContext, match="JSON object"):
        fsm.client.start_machine("cto_fix_bug", ["not", "a", "mapping"])  # type: ignore[arg-type]
    assert _machine_count(fsm) == before


@ONE_MODE
def test_start_with_a_context_its_schema_refuses_names_the_field_and_writes_nothing(
    fsm: FsmEnv,
) -> None:
    before = _machine_count(fsm)
    with pytest.raises(ContextMismatch) as refused:
        fsm.client.start_machine("cto_build_project", {"projectName": "sla-api"})
    assert (
        str(refused.value) == "context for cto_build_project: 'githubIssue' is a required property"
    )
    assert _machine_count(fsm) == before


@ONE_MODE
def test_unknown_machine_id_is_reported_by_name(fsm: FsmEnv) -> None:
    ghost = uuid.uuid4()
    with pytest.raises(MachineNotFound, match=str(ghost)):
        fsm.client.get_machine(ghost)
    with pytest.raises(MachineNotFound):
        fsm.client.history("not-a-uuid")


@ONE_MODE
def test_list_machines_filters_by_type_status_and_agent_type(fsm: FsmEnv) -> None:
    with ScriptedAgent(fsm) as agent:
        mid = fsm.client.start_machine("cto_infrastructure_check", {}, agent_id=agent.id)
        fsm.wait_until_done(mid)
    completed = fsm.client.list_machines(
        machine_type="cto_infrastructure_check", status="completed", agent_type="cto", limit=1000
    )
    assert mid in {m.id for m in completed}
    assert not fsm.client.list_machines(machine_type="cto_infrastructure_check", status="paused")
    stats = fsm.client.stats()
    assert stats["machines"]["cto_infrastructure_check"]["completed"] >= 1


@ONE_MODE
def test_a_running_machine_keeps_the_definition_version_it_started_with(
    fsm: FsmEnv, tmp_path: Path
) -> None:
    original = load_file(ROOT / "tests/fixtures/definitions/test_timeout.yaml")
    with ScriptedAgent(fsm) as agent:
        mid = fsm.client.start_machine("test_timeout", {"who": "v1"}, agent_id=agent.id)
        changed = original.model_copy(update={"description": "a new version"})
        [(_, new_version, created)] = fsm.client.engine.catalog.load([changed])
        fsm.wait_until_done(mid)
    assert created
    started_on = fsm.client.get_machine(mid).definition_version
    assert started_on == new_version - 1
    fsm.client.engine.catalog.load([original])  # back to the fixture's content


@ONE_MODE
def test_cli_start_status_and_history(fsm: FsmEnv, run) -> None:  # type: ignore[no-untyped-def]
    with ScriptedAgent(fsm) as agent:
        result = run("start", "cto_fix_bug", "--context", CLI_CONTEXT, "--agent-id", agent.id)
        assert result.exit_code == 0, result.output
        mid = uuid.UUID(result.output.strip())
        fsm.wait_until_done(mid)
    status = json.loads(run("status", str(mid), "--json").output)
    assert (status["status"], status["current_state"]) == ("completed", "COMPLETE")
    history = json.loads(run("history", str(mid), "--json").output)
    assert [h["to_state"] for h in history][-1] == "COMPLETE"
    text = run("history", str(mid)).output
    assert "ANALYZE_BUG -> LOCATE_CODE" in text


@ONE_MODE
def test_cli_start_with_malformed_context_says_what_is_wrong(run) -> None:  # type: ignore[no-untyped-def]
    result = run("start", "cto_fix_bug", "--context", "{not json")
    assert result.exit_code == 2
    assert "--context" in result.output and "not valid JSON" in result.output


@pytest.mark.parametrize(
    ("context", "says"),
    [
        ('{"topic": "caching"}', "'taskState' is a required property"),
        ('{"taskState": {"topic": "caching"}}', "at /taskState: 'query' is a required property"),
        ('{"taskState": {"query": 42}}', "at /taskState/query: 42 is not of type 'string'"),
    ],
)
@ONE_MODE
def test_cli_start_with_a_context_its_schema_refuses_says_which_field_in_one_line(  # type: ignore[no-untyped-def]
    fsm: FsmEnv, run, context: str, says: str
) -> None:
    before = _machine_count(fsm)
    result = run("start", "research_pipeline", "--context", context)
    assert result.exit_code == 1
    assert result.output == f"error: context for research_pipeline: {says}\n"
    assert _machine_count(fsm) == before


@ONE_MODE
def test_cli_definitions_load_refuses_a_schedule_whose_context_its_schema_refuses(  # type: ignore[no-untyped-def]
    fsm: FsmEnv, run, tmp_path: Path
) -> None:
    (tmp_path / "round.yaml").write_text(
        "type: ctx_round\nagent_type: tester\ninitial_state: A\n"
        "context_schema: {type: object, required: [region]}\n"
        "schedules: [{cron: '*/15 * * * *', context: {zone: eu}}]\n"
        "states:\n"
        "  - {name: A, prompt: 'Check {{ region }}', on_success: B, on_failure: B}\n"
        "  - {name: B, terminal: completed}\n"
    )
    result = run("definitions", "load", str(tmp_path))
    assert result.exit_code == 3
    assert result.output == (
        f"error: {tmp_path / 'round.yaml'}: field schedules[0].context: does not match the "
        "context_schema: 'region' is a required property\n"
    )
    assert "ctx_round" not in {s.machine_type for s in fsm.client.schedules()}


@ONE_MODE
def test_cli_start_with_unknown_type_fails_cleanly(run) -> None:  # type: ignore[no-untyped-def]
    result = run("start", "nope", "--context", "{}")
    assert result.exit_code == 1
    assert "unknown machine type 'nope'" in result.output
    assert "Traceback" not in result.output


@ONE_MODE
def test_cli_admin_commands_are_audited_with_actor_and_reason(fsm: FsmEnv, run) -> None:  # type: ignore[no-untyped-def]
    with ScriptedAgent(fsm, {"FIRST": [SILENT]}) as agent:
        mid = fsm.client.start_machine("test_pair", {}, agent_id=agent.id)
        agent.wait_for_tasks(1)
        paused = run("pause", str(mid), "--reason", "deploy freeze", "--actor", "alice")
        assert paused.exit_code == 0 and "paused" in paused.output
        refused = run("pause", str(mid))
        assert refused.exit_code == 1
        assert "cannot pause a paused machine" in refused.output
        assert run("force", str(mid), "DONE", "--actor", "bob").exit_code == 0
    rows = json.loads(run("history", str(mid), "--json").output)
    assert [(r["event"], r["actor"], r["reason"]) for r in rows[1:]] == [
        ("pause", "alice", "deploy freeze"),
        ("force", "bob", ""),
    ]
    assert "completed" in run("status", str(mid)).output


@ONE_MODE
def test_cli_rejected_lists_reasons(fsm: FsmEnv, run) -> None:  # type: ignore[no-untyped-def]
    fsm.redis.publish(ack_channel(fsm.settings.channel_prefix), "{definitely not json")
    deadline = time.monotonic() + 10
    while "malformed_json" not in (out := run("rejected", "--limit", "5").output):
        assert time.monotonic() < deadline, out
        time.sleep(0.1)
    assert json.loads(run("stats", "--json").output)["rejected"]["malformed_json"] >= 1


@ONE_MODE
def test_cli_schedules_list_pause_resume_and_show_the_audit(fsm: FsmEnv, run) -> None:  # type: ignore[no-untyped-def]
    ref = "cto_infrastructure_check/every-15-minutes"
    listed = run("schedules")
    assert listed.exit_code == 0 and ref in listed.output and "*/15 * * * *" in listed.output
    paused = run("schedules", "pause", ref, "--reason", "incident 12", "--actor", "carol")
    assert paused.exit_code == 0 and f"{ref}  paused" in paused.output
    assert " paused " in run("schedules", "list").output
    assert run("schedules", "resume", "cto_infrastructure_check", "--actor", "carol").exit_code == 0
    shown = run("schedules", "show", ref).output
    header, line = shown.splitlines()[:2]
    assert header.startswith("SCHEDULE ") and line.startswith(ref) and "  active  " in line
    assert "pause    by carol  (incident 12)" in shown and "resume   by carol" in shown
    missing = run("schedules", "pause", "nope/x")
    assert missing.exit_code == 1 and "no schedule 'nope/x'" in missing.output
