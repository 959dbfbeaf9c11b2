"""A machine's starting context against real PostgreSQL and Redis: a context that does not match
its definition's context_schema starts nothing (the engine's start, a schedule's tick), and a
prompt naming a key the context lacks fails its machine with nothing sent to an agent."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import func, select, update

from fsm_celery.core.loader import parse_definition
from fsm_celery.exceptions import ContextMismatch
from fsm_celery.store.tables import machines, schedule_runs, schedules, transitions
from tests.inprocess.conftest import Fsm


def _counts(fsm: Fsm) -> tuple[int, int]:
    with fsm.engine.db.connect() as conn:
        count = func.count()
        return (
            conn.execute(select(count).select_from(machines)).scalar_one(),
            conn.execute(select(count).select_from(transitions)).scalar_one(),
        )


def _load(fsm: Fsm, prompt: str, **more: object) -> None:
    fsm.engine.catalog.load(
        [
            parse_definition(
                {
                    "type": "ctx_round",
                    "agent_type": "tester",
                    "initial_state": "FIRST",
                    "states": [
                        {"name": "FIRST", "prompt": prompt, "on_success": "DONE"}
                        | {"on_failure": "REPORT"},  # where an agent would work
                        {"name": "REPORT", "prompt": "Report.", "on_success": "DONE"}
                        | {"on_failure": "FAILED"},
                        {"name": "DONE", "terminal": "completed"},
                        {"name": "FAILED", "terminal": "failed"},
                    ],
                    **more,
                }
            )
        ]
    )


@pytest.mark.parametrize(
    ("machine_type", "context", "says"),
    [
        ("research_pipeline", {"topic": "caching"}, "'taskState' is a required property"),
        (
            "research_pipeline",
            {"taskState": {"topic": "caching"}},
            "at /taskState: 'query' is a required property",
        ),
        ("cto_build_project", {"githubIssue": 726}, "'projectName' is a required property"),
        (
            "cto_fix_bug",
            {"projectName": "sla-api", "githubIssue": "740"},
            "at /githubIssue: '740' is not of type 'integer'",
        ),
    ],
)
def test_a_context_that_does_not_match_its_schema_starts_nothing(
    fsm: Fsm, machine_type: str, context: dict[str, object], says: str
) -> None:
    agent = fsm.agent("researcher" if machine_type == "research_pipeline" else "cto")
    before = _counts(fsm)
    with pytest.raises(ContextMismatch) as refused:
        fsm.start(machine_type, context)
    assert str(refused.value) == f"context for {machine_type}: {says}"
    assert (refused.value.machine_type, refused.value.detail) == (machine_type, says)
    assert _counts(fsm) == before
    assert agent.tasks() == []


def test_a_prompt_naming_a_key_the_context_lacks_fails_its_machine_with_nothing_sent(
    fsm: Fsm,
) -> None:
    """No schema says what the context holds: the render finds out, and the machine fails
    where it is, its failure edge (to REPORT, a working state) not taken."""
    _load(fsm, "Research {{ topic }}.")
    agent = fsm.agent("tester")
    mid = fsm.start("ctx_round", {"query": "caching"})
    machine = fsm.machine(mid)
    assert (machine.status, machine.current_state) == ("failed", "FIRST")
    assert machine.error == "not dispatched: prompt of FIRST: 'topic' is undefined"
    history = fsm.history(mid)
    assert [(h.event, h.from_state, h.to_state, h.success) for h in history] == [
        ("start", None, "FIRST", True),
        ("dispatch_error", "FIRST", "FIRST", False),
    ]
    assert history[-1].error_message == machine.error
    assert agent.tasks() == []
    assert fsm.scan() == []  # nothing left due: the scan does not send it either
    assert agent.tasks() == []


def test_a_schedules_context_is_checked_again_at_its_tick(fsm: Fsm) -> None:
    """A schedule row stored before its definition had a schema (an upgrade) ticks into the
    same check as any start: the run is recorded failed, with the reason, and nothing starts."""
    schema = {"type": "object", "required": ["region"]}
    fsm.clock.now = datetime(2026, 3, 2, 12, 5, tzinfo=UTC)
    _load(
        fsm,
        "Check {{ region }}.",
        context_schema=schema,
        schedules=[{"cron": "*/10 * * * *", "context": {"region": "eu"}}],
    )
    with fsm.engine.db.begin() as conn:
        conn.execute(
            update(schedules).where(schedules.c.machine_type == "ctx_round").values(context={})
        )
    before = _counts(fsm)
    fsm.clock.now = datetime(2026, 3, 2, 12, 10, 1, tzinfo=UTC)
    assert fsm.engine.schedules.run() == (1, [])
    assert _counts(fsm) == before
    with fsm.engine.db.connect() as conn:
        [run] = conn.execute(select(schedule_runs)).all()
    assert (run.outcome, run.machine_id) == ("failed", None)
    assert run.detail == "context for ctx_round: 'region' is a required property"
