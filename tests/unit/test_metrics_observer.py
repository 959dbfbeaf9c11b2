"""What the metrics count of a committed transaction, read from its write-set: outcomes,
retries, timeouts, attempt times, budget refusals, rejections, and an ack's way to its next
state. Counters are read before and after (the process's registry is shared)."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any

import pytest
from prometheus_client import REGISTRY

from fsm_celery.core.definition import FailureKind
from fsm_celery.core.transition import MachineStatus, Transition
from fsm_celery.core.usage import BUDGET_EXCEEDED
from fsm_celery.engine.ports import Inbound
from fsm_celery.metrics.agent import outcome as agent_outcome
from fsm_celery.metrics.observer import Counting, outcome, root_type
from fsm_celery.store.rows import Rejection
from fsm_celery.store.writes import Writes

NOW = datetime(2026, 1, 1, 12, 0, tzinfo=UTC)
RUNNING, FAILED, PAUSED = MachineStatus.RUNNING, MachineStatus.FAILED, MachineStatus.PAUSED


def moved(
    to: str = "B",
    status: MachineStatus = RUNNING,
    *,
    success: bool = True,
    failure: FailureKind | None = None,
    error: str | None = None,
    delay: float = 0.0,
) -> Transition:
    return Transition("A", to, success, status, {}, 2, 0, None, error, failure, delay_seconds=delay)


def value(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


def row(machine_type: str = "t_obs", entered: float = 4.0) -> Any:
    return SimpleNamespace(
        id=uuid.uuid4(),
        type=machine_type,
        status="running",
        entered_at=NOW - timedelta(seconds=entered),
    )


@pytest.mark.parametrize(
    ("transition", "event", "expected"),
    [
        (moved(), "ack", "succeeded"),
        (moved("A", failure=FailureKind.FAILURE, success=False), "ack", "retried"),
        (moved("A", failure=FailureKind.TIMEOUT, success=False), "timeout", "timed_out"),
        (moved("X", FAILED, success=False, failure=FailureKind.FAILURE), "ack", "failed"),
        (moved("A", MachineStatus.CANCELLED, success=False), "cancel", "cancelled"),
        (moved("A", success=False), "handback", "handed_back"),
        (moved("B", PAUSED, error=f"{BUDGET_EXCEEDED}: 9 tokens"), "ack", "refused"),
        (moved("A", PAUSED, success=False), "pause", "other"),
    ],
)
def test_each_transition_has_one_outcome(transition: Transition, event: str, expected: str) -> None:
    assert outcome(transition, event) == expected


def test_a_childs_type_counts_under_its_root() -> None:
    assert root_type("build.BUILD.tests") == "build"
    assert root_type("build") == "build"


def test_a_transaction_counts_its_transitions_retries_timeouts_and_attempt_times() -> None:
    writes = Writes(NOW)
    writes.log += [
        (row("t_obs.S.branch"), moved(), "ack"),
        (row(), moved("A", failure=FailureKind.TIMEOUT, success=False), "timeout"),
        (row(), moved("B", PAUSED, error=f"{BUDGET_EXCEEDED}: cost 2"), "ack"),
        (row(entered=30), moved("C"), "join"),
    ]
    before = {
        "ok": value("fsm_transitions_total", machine_type="t_obs", mode="m1", outcome="succeeded"),
        "timeouts": value("fsm_timeouts_total", machine_type="t_obs", state="A"),
        "retries": value("fsm_retries_total", machine_type="t_obs", state="A"),
        "budget": value("fsm_budget_refusals_total", machine_type="t_obs"),
        "attempts": value("fsm_attempt_duration_seconds_count", machine_type="t_obs", state="A"),
        "joins": value("fsm_join_seconds_count", machine_type="t_obs"),
    }
    Counting("m1").committed(writes)
    assert (
        value("fsm_transitions_total", machine_type="t_obs", mode="m1", outcome="succeeded")
        == before["ok"] + 2
    )
    assert value("fsm_timeouts_total", machine_type="t_obs", state="A") == before["timeouts"] + 1
    assert value("fsm_retries_total", machine_type="t_obs", state="A") == before["retries"] + 1
    assert value("fsm_budget_refusals_total", machine_type="t_obs") == before["budget"] + 1
    attempts = value("fsm_attempt_duration_seconds_count", machine_type="t_obs", state="A")
    assert attempts == before["attempts"] + 4
    assert value("fsm_join_seconds_count", machine_type="t_obs") == before["joins"] + 1


def test_rejections_are_counted_by_reason_and_the_unprocessable_apart() -> None:
    writes = Writes(NOW)
    for reason in ("stale_attempt", "unprocessable"):
        writes.rejections.append(Rejection(reason, "", "{}", NOW, None, None, None))
    stale = value("fsm_rejected_messages_total", reason="stale_attempt")
    unprocessable = value("fsm_unprocessable_total")
    Counting("m2").committed(writes)
    assert value("fsm_rejected_messages_total", reason="stale_attempt") == stale + 1
    assert value("fsm_unprocessable_total") == unprocessable + 1


def test_an_ack_is_timed_to_its_next_state_only_when_one_follows_at_once() -> None:
    writes = Writes(NOW)
    entered, delayed, ended, unstored = (uuid.uuid4() for _ in range(4))
    for mid, status, delay in (
        (entered, "running", 0.0),
        (delayed, "running", 5.0),  # a retry's backoff first
        (ended, "completed", 0.0),
        (unstored, "running", 0.0),
    ):
        writes.moves[mid] = SimpleNamespace(id=mid, status=status)  # type: ignore[assignment]
        writes.types[mid], writes.delays[mid] = "t_obs", delay
    writes.entered.add(entered)

    def acked(mid: uuid.UUID, stored: float | None) -> tuple[Any, Inbound]:
        return SimpleNamespace(machine_id=mid), Inbound("{}", None, stored)

    applied = [acked(mid, NOW.timestamp()) for mid in (entered, delayed, ended)]
    applied.append(acked(unstored, None))  # read from pub/sub: no entry time
    for mode in ("inline", "celery"):  # inline: its state_task sent; celery: handed on
        before = value("fsm_ack_to_task_seconds_count", machine_type="t_obs", mode=mode)
        Counting(mode).acks_applied(writes, applied)
        after = value("fsm_ack_to_task_seconds_count", machine_type="t_obs", mode=mode)
        assert after == before + 1


def test_counting_never_fails_what_committed() -> None:
    writes = Writes(NOW)
    writes.log.append((SimpleNamespace(), moved(), "ack"))  # a row with nothing on it
    Counting("m3").committed(writes)
    Counting("m3").acks_applied(writes, [(None, Inbound("{}", None, 1.0))])


@pytest.mark.parametrize(
    ("reply", "expected"),
    [
        (None, "dropped"),
        ({"type": "state_ack", "success": True}, "succeeded"),
        ({"type": "state_ack", "success": False}, "failed"),
        ({"type": "state_handback"}, "handed_back"),
    ],
)
def test_an_agents_task_outcome_is_its_reply(reply: dict[str, Any] | None, expected: str) -> None:
    assert agent_outcome(reply) == expected


def test_observations_added_at_once_read_as_observed_one_by_one() -> None:
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from fsm_celery.metrics.tally import BOUNDS, Tally

    values = [0.001, 0.005, 0.07, 0.07, 2.0, 999.0]
    one_by_one, at_once = CollectorRegistry(), CollectorRegistry()
    buckets = BOUNDS["fsm_ack_to_task_seconds"][:-1]
    observed = Histogram("h", "h", ["t"], buckets=buckets, registry=one_by_one)
    added = Histogram("h", "h", ["t"], buckets=buckets, registry=at_once)
    tally = Tally()
    for v in values:
        observed.labels("x").observe(v)
        tally.observe(("fsm_ack_to_task_seconds", "x"), v)
    tally.flush(lambda key: added.labels(*key[1:]))

    def samples(registry: CollectorRegistry) -> list[str]:
        text = generate_latest(registry).decode()
        return [
            line for line in text.splitlines() if line.startswith("h_") and "created" not in line
        ]

    assert samples(at_once) == samples(one_by_one)


def test_a_new_master_is_a_failover_counted_once_per_process() -> None:
    from fsm_celery.metrics.failovers import seen

    service = f"master-{uuid.uuid4().hex[:6]}"
    assert not seen(service, ("10.0.0.1", 6379))  # the first one seen: no failover
    assert not seen(service, ("10.0.0.1", 6379))
    assert seen(service, ("10.0.0.2", 6379))  # the sentinels promoted another
    assert not seen(service, ("10.0.0.2", 6379))  # another client of the process follows it
