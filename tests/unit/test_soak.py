"""The soak's pure parts (bench/soak.py runs the whole, outside CI): its fault schedule from a
seed, its memory verdict, and its end checks on fabricated PostgreSQL rows."""

from __future__ import annotations

import uuid
from collections import Counter
from itertools import pairwise
from typing import Any

import pytest

from bench.soak_actors import Journal
from bench.soak_checks import (
    Records,
    check_attempts_once,
    check_ended_once,
    check_ended_where_defined,
    check_events_applied_once,
    check_gates_decided_once,
    check_joined_once,
    check_operator_once,
)
from bench.soak_faults import KINDS, kinds_for, schedule
from bench.soak_memory import verdict


def _id(n: int) -> uuid.UUID:
    return uuid.UUID(int=n)


def _machine(n: int, machine_type: str, status: str = "completed", **extra: Any) -> dict[str, Any]:
    state = {"completed": "DONE", "failed": "FAILED"}.get(status, "S0")
    row = {"id": _id(n), "type": machine_type, "status": status, "current_state": state}
    return {"parent_id": None, "forked_from": None, "attempt": 3, **row, **extra}


def _row(n: int, attempt: int, event: str, to_state: str, correction: int = 0) -> dict[str, Any]:
    return {
        "machine_id": _id(n),
        "attempt": attempt,
        "correction": correction,
        "event": event,
        "to_state": to_state,
        "success": True,
    }


def _loop_history(n: int) -> list[dict[str, Any]]:
    return [_row(n, 0, "start", "S0"), _row(n, 1, "ack", "S1"), _row(n, 2, "ack", "DONE")]


# ---- the fault schedule ----------------------------------------------------------------------


def test_the_same_seed_gives_the_same_faults_and_another_seed_others() -> None:
    kinds = kinds_for("redis")
    assert schedule(41, 600, kinds) == schedule(41, 600, kinds)
    assert schedule(41, 600, kinds) != schedule(42, 600, kinds)


def test_every_kind_comes_once_a_round_so_a_short_run_meets_them_all() -> None:
    kinds = kinds_for("redis")
    faults = schedule(3, 120, kinds, every=(1.0, 2.0))
    for start in range(0, len(faults) - len(kinds) + 1, len(kinds)):
        assert sorted(f.kind for f in faults[start : start + len(kinds)]) == sorted(kinds)


def test_faults_come_after_gaps_within_the_bounds_and_before_the_end() -> None:
    faults = schedule(5, 300, kinds_for("redis"), every=(4.0, 10.0))
    gaps = [b.at - a.at for a, b in pairwise(faults)]
    assert 4.0 <= faults[0].at <= 10.0
    assert all(4.0 - 1e-6 <= gap <= 10.0 + 1e-6 for gap in gaps)
    assert faults[-1].at < 300


def test_the_broker_restart_is_a_fault_of_the_amqp_broker_only() -> None:
    assert "broker_restart" not in kinds_for("redis")
    assert kinds_for("amqp") == (*KINDS, "broker_restart")


@pytest.mark.parametrize(
    ("kinds", "every", "fragment"),
    [
        ((), (4.0, 10.0), "at least one"),
        (("kill_worker",), (0.0, 1.0), "0 < low"),
        (("unplug",), (4.0, 10.0), "unknown fault kinds ['unplug']"),
    ],
)
def test_a_schedule_of_bad_arguments_is_refused_by_name(
    kinds: tuple[str, ...], every: tuple[float, float], fragment: str
) -> None:
    with pytest.raises(ValueError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        schedule(1, 60, kinds, every=every)


# ---- memory ----------------------------------------------------------------------------------


def test_a_process_that_warms_up_then_holds_is_flat() -> None:
    warm = [100.0, 120, 125, 126, 126, 125, 126, 127, 126, 126]
    assert verdict(warm, 10, span=900)["flat"] is True


def test_a_process_that_keeps_growing_is_not_flat() -> None:
    figures = verdict([100.0 + 10 * k for k in range(12)], 12, span=900)
    assert figures["flat"] is False
    assert (figures["first_mb"], figures["last_mb"], figures["max_mb"]) == (100, 210, 210)


def test_a_series_too_short_or_of_a_restarted_copy_is_reported_not_judged() -> None:
    assert verdict([100.0] * 5, 5, span=900)["flat"] is None
    assert verdict([100.0] * 20, 90, span=900)["flat"] is None  # under a third of the run
    assert verdict([100.0] * 90, 90, span=120)["flat"] is None  # a smoke run: the warm-up


# ---- the end checks --------------------------------------------------------------------------


def test_machines_ended_as_defined_pass_and_a_running_one_is_lost() -> None:
    journal = Journal()
    journal.start(_id(1), "loop")
    journal.start(_id(2), "loop")
    records = Records(machines=[_machine(1, "soak_loop"), _machine(2, "soak_loop", "running")])
    check = check_ended_where_defined(records, journal)
    assert check.checked == 2
    assert len(check.failures) == 1
    assert "lost: still running at S0" in check.failures[0]


def test_a_gate_ends_as_the_approver_chose() -> None:
    journal = Journal()
    journal.choices[(_id(1), 1)] = "reject"
    journal.choices[(_id(2), 1)] = "approve"
    records = Records(
        machines=[_machine(1, "soak_gate", "failed"), _machine(2, "soak_gate", "failed")]
    )
    [failure] = check_ended_where_defined(records, journal).failures
    assert failure.endswith("(gate) failed, expected completed")
    assert str(_id(2)) in failure


def test_a_machine_started_but_never_stored_is_lost() -> None:
    journal = Journal()
    journal.start(_id(9), "wait")
    [failure] = check_ended_where_defined(Records(), journal).failures
    assert "was started, not stored" in failure


def test_an_attempt_recorded_twice_or_skipped_fails() -> None:
    doubled = [*_loop_history(1), _row(1, 2, "timeout", "S1")]
    skipped = [_row(2, 0, "start", "S0"), _row(2, 2, "ack", "DONE")]
    corrected = [*_loop_history(3), _row(3, 1, "ack", "S0", correction=1)]
    check = check_attempts_once(Records(history=[*doubled, *skipped, *corrected]))
    assert check.checked == 3
    assert [f.split(":")[1].strip() for f in check.failures] == [
        "attempts [2] recorded more than once",
        "attempts [1] missing from its history",
    ]


def test_a_machine_ended_twice_fails_but_one_ended_again_after_a_rewind_passes() -> None:
    rewound = [*_loop_history(2), _row(2, 3, "rewind", "S1"), _row(2, 4, "ack", "DONE")]
    twice = [*_loop_history(1), _row(1, 3, "ack", "DONE")]
    records = Records(
        machines=[_machine(1, "soak_loop"), _machine(2, "soak_loop")], history=[*twice, *rewound]
    )
    [failure] = check_ended_once(records).failures
    assert failure.startswith(f"{_id(1)} ended 2 times")


def _fan(parent: int, verdict_: str = "met", total: int = 2) -> dict[str, Any]:
    return {
        "parent_id": _id(parent),
        "attempt": 1,
        "verdict": verdict_,
        "total": total,
        "closed": True,
    }


def _slots(parent: int, children: list[int]) -> list[dict[str, Any]]:
    return [
        {"parent_id": _id(parent), "attempt": 1, "slot": k, "child_id": _id(c), "status": "x"}
        for k, c in enumerate(children)
    ]


def test_a_fan_out_joined_once_with_its_children_ended_passes() -> None:
    machines = [
        _machine(1, "soak_map"),
        *(_machine(c, "soak_step", parent_id=_id(1)) for c in (11, 12)),
    ]
    records = Records(
        machines=machines,
        history=[_row(1, 0, "start", "EACH"), _row(1, 1, "join", "AFTER")],
        fan_outs=[_fan(1)],
        items=_slots(1, [11, 12]),
    )
    check = check_joined_once(records)
    assert (check.checked, check.failures) == (1, [])


def test_a_join_recorded_twice_or_a_child_not_ended_fails() -> None:
    machines = [
        _machine(1, "soak_map"),
        _machine(11, "soak_step", parent_id=_id(1)),
        _machine(12, "soak_step", "running", parent_id=_id(1)),
    ]
    records = Records(
        machines=machines,
        history=[_row(1, 1, "join", "AFTER"), _row(1, 2, "join", "AFTER")],
        fan_outs=[_fan(1)],
        items=_slots(1, [11, 12]),
    )
    failures = check_joined_once(records).failures
    assert any("slot 1" in f and "not ended" in f for f in failures)
    assert any("2 join rows, 1 fan-outs decided" in f for f in failures)


def _gate(gate_id: int, machine: int, verdict_: str = "approved") -> dict[str, Any]:
    return {
        "id": gate_id,
        "machine_id": _id(machine),
        "attempt": 2,
        "verdict": verdict_,
        "closed": verdict_ != "pending",
    }


def test_a_gate_decided_once_as_chosen_passes() -> None:
    journal = Journal()
    journal.choices[(_id(1), 2)] = "approve"
    journal.decisions[(_id(1), 2)] = [{"recorded": True}, {"recorded": False}]  # a lost reply
    records = Records(
        gates=[_gate(5, 1)],
        decisions=[{"gate_id": 5, "machine_id": _id(1), "actor": "a", "decision": "approve"}],
        history=[_row(1, 2, "approval", "SHIP")],
    )
    check = check_gates_decided_once(records, journal)
    assert (check.checked, check.failures) == (1, [])


def test_a_gate_left_open_decided_twice_or_otherwise_than_chosen_fails() -> None:
    journal = Journal()
    journal.choices[(_id(1), 2)] = "reject"
    decision = {"gate_id": 5, "machine_id": _id(1), "actor": "a", "decision": "approve"}
    records = Records(
        gates=[_gate(5, 1), _gate(6, 2, "pending")],
        decisions=[decision, {**decision, "actor": "b"}],
        history=[_row(1, 2, "approval", "SHIP"), _row(1, 3, "approval", "SHIP")],
    )
    failures = check_gates_decided_once(records, journal).failures
    assert any("still open" in f for f in failures)
    assert any("gate 5: 2 decisions" in f for f in failures)
    assert any("approve recorded, the approver chose reject" in f for f in failures)
    assert any("2 approval rows for 1 gates" in f for f in failures)


def test_an_event_applied_once_however_often_sent_passes_and_twice_fails() -> None:
    journal = Journal()
    journal.events[_id(1)] = ["kept", "duplicate"]
    journal.events[_id(2)] = ["applied", "applied"]
    records = Records(
        machines=[_machine(1, "soak_wait"), _machine(2, "soak_wait")],
        events=[{"machine_id": _id(m), "key": f"k{m}", "outcome": "applied"} for m in (1, 2)],
        history=[
            _row(1, 2, "signal", "DEPLOY"),
            _row(2, 2, "signal", "DEPLOY"),
            _row(2, 3, "signal", "DEPLOY"),
        ],
    )
    failures = check_events_applied_once(records, journal).failures
    assert failures == [
        f"{_id(2)}: 2 signal rows",
        f"{_id(2)}: a resend under the same key answered ['applied']",
    ]


def test_rewinds_and_forks_are_held_against_what_the_operator_did() -> None:
    journal = Journal()
    journal.rewinds[_id(1)] = [4]
    journal.rewinds[_id(2)] = [4]
    journal.uncertain.add(_id(2))
    journal.forks[_id(7)] = _id(3)
    records = Records(
        machines=[
            _machine(7, "soak_loop", forked_from=_id(3)),
            _machine(8, "soak_loop", forked_from=_id(4)),
        ],
        history=[
            _row(1, 4, "rewind", "S1"),
            _row(1, 5, "rewind", "S1"),
            _row(2, 4, "rewind", "S1"),
            _row(2, 5, "rewind", "S1"),
            _row(7, 2, "fork", "S1"),
        ],
    )
    failures = check_operator_once(records, journal).failures
    assert failures == [
        f"{_id(1)}: 2 rewind rows, 1 rewinds made",
        f"fork {_id(8)} of {_id(4)}: no fork was asked",
    ]
    assert Counter(journal.refused) == Counter()


def test_the_trend_shows_a_series_evenly_from_its_first_sample_to_its_last() -> None:
    figures = verdict([float(k) for k in range(100)], 100, span=900)
    trend = figures["trend_mb"]
    assert isinstance(trend, list)
    assert (len(trend), trend[0], trend[-1]) == (12, 0.0, 99.0)
    assert trend == sorted(trend)
