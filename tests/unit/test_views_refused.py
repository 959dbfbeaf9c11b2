"""`fsm-celery history` shows an answer refused as such: neither a step that failed nor one
that moved the machine."""

from __future__ import annotations

from datetime import UTC, datetime

from fsm_celery import views
from fsm_celery.records import TransitionRecord


def _record(event: str, success: bool, error: str | None = None) -> TransitionRecord:
    return TransitionRecord(
        attempt=1,
        event=event,
        from_state="CHECK",
        to_state="CHECK" if event == "refused" else "DONE",
        success=success,
        output=None,
        error_message=error,
        failure=None,
        duration_ms=None,
        actor=None,
        reason=None,
        progress=None,
        agent_id=None,
        tokens_used=0,
        cost=0.0,
        created_at=datetime.now(UTC),
    )


def test_history_shows_a_refusal_as_refused_with_its_problems() -> None:
    refused = _record("refused", False, "answer refused (1 corrections left): /passed: no")
    header, first, second = views.history([refused, _record("ack", True)])
    assert "RESULT" in header
    assert "refused" in first.split() and "/passed" in first
    assert "FAIL" not in first
    assert second.split()[1] == "ok"
