"""The pure join of a fan-out (fsm_celery.core.join): its rules, its counts, what it starts and
cancels, and the output it merges; then properties of a fan-out driven as the engine drives it,
over any interleaving of children's ends, redeliveries and cancels."""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from fractions import Fraction
from functools import cache
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fsm_celery.core.definition import MachineDefinition, StateDefinition
from fsm_celery.core.join import (
    Rule,
    Settled,
    Slot,
    SlotStatus,
    Tally,
    Together,
    Verdict,
    child_ended,
    ended_together,
    failure_of,
    merge,
    opening,
    rule_for,
    to_cancel,
    tolerated_of,
    verdict,
)
from fsm_celery.core.loader import parse_definition

PROPERTY = settings(
    max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow]
)

# A child's states, as a branch or a map writes them inline.
BODY: dict[str, Any] = {
    "initial_state": "GO",
    "states": [
        {"name": "GO", "on_success": "DONE", "on_failure": "FAILED"},
        {"name": "DONE", "terminal": "completed"},
        {"name": "FAILED", "terminal": "failed"},
    ],
}


def definition(state: dict[str, Any]) -> MachineDefinition:
    """A machine whose one working state is the fan-out given, validated as a loaded one is."""
    return parse_definition(
        {
            "type": "fan",
            "agent_type": "tester",
            "initial_state": state["name"],
            "states": [
                {**state, "on_success": "DONE", "on_failure": "FAILED"},
                {"name": "DONE", "terminal": "completed"},
                {"name": "FAILED", "terminal": "failed"},
            ],
        }
    )


def parallel(branches: int | list[str], join: Any = "all", tolerated: int = 0) -> dict[str, Any]:
    names = branches if isinstance(branches, list) else [f"b{i}" for i in range(branches)]
    spec = {"branches": [{"name": n, **BODY} for n in names], "join": join}
    return {
        "name": "FAN",
        "parallel": spec | ({"tolerated_failures": tolerated} if tolerated else {}),
    }


def mapping(concurrency: int = 1000, tolerated: int | str = 0, **more: Any) -> dict[str, Any]:
    spec = {"items": "context.items", "max_concurrency": concurrency, **BODY, **more}
    return {"name": "EACH", "map": spec | {"tolerated_failures": tolerated}}


def state_of(state: dict[str, Any]) -> tuple[MachineDefinition, StateDefinition]:
    d = definition(state)
    return d, d.state(state["name"])


def rule(state: dict[str, Any], total: int) -> Rule:
    return rule_for(state_of(state)[1], total)


CHILD_MACHINE: dict[str, Any] = {"name": "DELEGATE", "machine": "other"}


# -- rules --------------------------------------------------------------------------------------


def test_join_all_needs_every_branch() -> None:
    assert rule(parallel(3), 3) == Rule(3, 3, 0, True, 3)


def test_join_all_with_tolerated_failures_needs_the_rest() -> None:
    assert rule(parallel(3, tolerated=1), 3) == Rule(3, 2, 1, True, 3)


def test_join_any_needs_one_success_and_stops_waiting() -> None:
    assert rule(parallel(3, "any"), 3) == Rule(3, 1, 2, False, 3)


def test_join_at_least_needs_k_successes() -> None:
    assert rule(parallel(4, {"at_least": 3}), 4) == Rule(4, 3, 1, False, 4)


def test_map_tolerates_a_count_of_failures_and_bounds_its_children() -> None:
    assert rule(mapping(4, tolerated=2), 10) == Rule(10, 8, 2, True, 4)


def test_map_tolerates_a_percentage_of_its_items_rounded_down() -> None:
    assert rule(mapping(tolerated="10%"), 15).tolerated == 1
    assert rule(mapping(tolerated="10%"), 9).tolerated == 0
    assert rule(mapping(tolerated="12.5%"), 8).tolerated == 1
    assert rule(mapping(tolerated="100%"), 7).tolerated == 7


@given(
    percent=st.integers(0, 100_000).map(lambda n: Fraction(n, 1000)).filter(lambda p: p <= 100),
    total=st.integers(0, 100_000),
)
@settings(max_examples=300, database=None)
def test_a_percentage_tolerates_its_share_of_the_items_rounded_down(
    percent: Fraction, total: int
) -> None:
    text = f"{float(percent):g}%" if percent.denominator > 1 else f"{percent.numerator}%"
    assert tolerated_of(text, total) == int(percent * total / 100)


def test_a_map_without_max_concurrency_starts_every_item() -> None:
    unbounded = {"name": "EACH", "map": {"items": "context.items", **BODY}}
    d = parse_definition(
        {
            "type": "fan",
            "agent_type": "tester",
            "initial_state": "EACH",
            "context_schema": {"properties": {"items": {"type": "array", "maxItems": 50}}},
            "states": [
                {**unbounded, "on_success": "DONE", "on_failure": "FAILED"},
                {"name": "DONE", "terminal": "completed"},
                {"name": "FAILED", "terminal": "failed"},
            ],
        }
    )
    assert rule_for(d.state("EACH"), 30).max_concurrency == 30
    assert rule_for(d.state("EACH"), 0).max_concurrency == 1


def test_a_child_machine_is_joined_by_its_one_end() -> None:
    assert rule(CHILD_MACHINE, 1) == Rule(1, 1, 0, True, 1)


# -- verdict ------------------------------------------------------------------------------------


def test_join_all_stays_pending_until_every_child_has_finished() -> None:
    r = rule(parallel(3, tolerated=1), 3)
    assert verdict(r, Tally(3, succeeded=2)) is Verdict.PENDING
    assert verdict(r, Tally(3, succeeded=2, failed=1)) is Verdict.MET


def test_join_all_fails_at_the_first_failure_past_those_tolerated() -> None:
    r = rule(parallel(3, tolerated=1), 3)
    assert verdict(r, Tally(3, failed=1)) is Verdict.PENDING
    assert verdict(r, Tally(3, failed=2)) is Verdict.FAILED


def test_join_at_least_is_met_by_k_successes_with_children_still_out() -> None:
    r = rule(parallel(4, {"at_least": 2}), 4)
    assert verdict(r, Tally(4, succeeded=1, failed=1)) is Verdict.PENDING
    assert verdict(r, Tally(4, succeeded=2)) is Verdict.MET


def test_join_at_least_fails_once_k_successes_are_out_of_reach() -> None:
    r = rule(parallel(4, {"at_least": 2}), 4)
    assert verdict(r, Tally(4, succeeded=1, failed=2)) is Verdict.PENDING
    assert verdict(r, Tally(4, succeeded=1, failed=3)) is Verdict.FAILED


def test_join_any_fails_only_when_every_branch_has() -> None:
    r = rule(parallel(2, "any"), 2)
    assert verdict(r, Tally(2, failed=1)) is Verdict.PENDING
    assert verdict(r, Tally(2, failed=2)) is Verdict.FAILED


# -- opening ------------------------------------------------------------------------------------


def test_an_empty_map_is_met_at_once() -> None:
    assert opening(rule(mapping(), 0)) == (Tally(verdict=Verdict.MET), 0)


def test_max_concurrency_bounds_the_first_start() -> None:
    assert opening(rule(mapping(2), 5)) == (Tally(started=2), 2)


def test_a_parallel_state_starts_every_branch() -> None:
    assert opening(rule(parallel(3), 3)) == (Tally(started=3), 3)


# -- child_ended --------------------------------------------------------------------------------


def test_an_end_is_counted_as_a_success_or_a_failure() -> None:
    r = rule(parallel(3), 3)
    tally, _ = opening(r)
    assert child_ended(r, tally, True).tally == Tally(3, succeeded=1)
    assert child_ended(r, tally, False).tally == Tally(3, failed=1, verdict=Verdict.FAILED)


def test_a_slot_freed_starts_the_next_waiting_item() -> None:
    r = rule(mapping(2), 3)
    tally, _ = opening(r)
    first = child_ended(r, tally, True)
    assert (first.start, first.tally) == (1, Tally(3, succeeded=1))
    second = child_ended(r, first.tally, True)
    assert (second.start, second.tally.started) == (0, 3)


def test_a_failure_the_map_tolerates_starts_the_next_item_too() -> None:
    r = rule(mapping(1, tolerated=1), 3)
    tally, _ = opening(r)
    settled = child_ended(r, tally, False)
    assert settled == Settled(Tally(2, failed=1), 1, False)


def test_the_end_that_decides_the_join_says_so_once() -> None:
    r = rule(parallel(2), 2)
    tally, _ = opening(r)
    first = child_ended(r, tally, True)
    last = child_ended(r, first.tally, True)
    assert (first.decided, last.decided) == (False, True)
    assert last.tally.verdict is Verdict.MET


def test_a_decided_join_counts_nothing_more() -> None:
    r = rule(parallel(3, "any"), 3)
    tally, _ = opening(r)
    won = child_ended(r, tally, True).tally
    assert child_ended(r, won, False) == Settled(won, 0, False)
    assert child_ended(r, won, True) == Settled(won, 0, False)


def test_a_failed_join_starts_no_more_items() -> None:
    r = rule(mapping(1), 3)
    tally, _ = opening(r)
    assert child_ended(r, tally, False) == Settled(
        Tally(1, failed=1, verdict=Verdict.FAILED), 0, True
    )


# -- ended_together -----------------------------------------------------------------------------


def test_ends_arriving_with_the_one_that_meets_the_join_are_counted_too() -> None:
    r = rule(parallel(3, {"at_least": 2}), 3)
    one = child_ended(r, opening(r)[0], True).tally
    together = ended_together(r, one, [True, True])
    assert together == Together(Tally(3, succeeded=3, verdict=Verdict.MET), 0, 0)


def test_a_failure_arriving_with_the_end_that_meets_the_join_is_counted_as_one() -> None:
    r = rule(parallel(4, {"at_least": 2}), 4)
    together = ended_together(r, opening(r)[0], [True, False, True, False])
    assert together == Together(Tally(4, succeeded=2, failed=2, verdict=Verdict.MET), 0, 2)


def test_the_first_end_that_decides_the_join_decided_it_whatever_follows() -> None:
    r = rule(parallel(3, "any"), 3)
    together = ended_together(r, opening(r)[0], [False, True, True])
    assert (together.decider, together.tally.succeeded, together.tally.failed) == (1, 2, 1)


def test_ends_that_leave_the_join_pending_start_the_items_their_slots_free() -> None:
    r = rule(mapping(2, tolerated=1), 5)
    together = ended_together(r, opening(r)[0], [True, False])
    assert together == Together(Tally(4, succeeded=1, failed=1), 2, None)


def test_no_item_starts_in_a_slot_freed_before_the_end_that_fails_the_map() -> None:
    r = rule(mapping(2), 5)
    together = ended_together(r, opening(r)[0], [True, False])
    assert together == Together(Tally(2, succeeded=1, failed=1, verdict=Verdict.FAILED), 0, 1)


def test_ends_after_a_join_decided_before_count_nothing() -> None:
    r = rule(parallel(3, "any"), 3)
    won = child_ended(r, opening(r)[0], True).tally
    assert ended_together(r, won, [True, False]) == Together(won, 0, None)


# -- to_cancel ----------------------------------------------------------------------------------


def test_a_decided_join_cancels_the_children_running_or_waiting() -> None:
    slots = [
        Slot(0, SlotStatus.SUCCEEDED, {}),
        Slot(1, SlotStatus.RUNNING),
        Slot(2, SlotStatus.FAILED, error="boom"),
        Slot(3, SlotStatus.WAITING),
        Slot(4, SlotStatus.CANCELLED),
    ]
    assert to_cancel(slots) == [1, 3]


# -- merge --------------------------------------------------------------------------------------


def test_branches_merge_in_the_definitions_order_whatever_order_they_ended_in() -> None:
    d, state = state_of(parallel(["tests", "docs", "lint"]))
    ended = [
        Slot(2, SlotStatus.SUCCEEDED, {"clean": True}),
        Slot(0, SlotStatus.SUCCEEDED, {"suite": "ok"}),
        Slot(1, SlotStatus.SUCCEEDED, {"pages": 3}),
    ]
    merged = merge(d, state, ended)
    assert list(merged.items()) == [
        ("tests", {"suite": "ok"}),
        ("docs", {"pages": 3}),
        ("lint", {"clean": True}),
    ]


def test_a_map_merges_its_results_in_item_order_with_a_record_of_each_failure() -> None:
    d, state = state_of(mapping(result_key="results"))
    ended = [
        Slot(3, SlotStatus.CANCELLED, None, "cancelled by the join"),
        Slot(1, SlotStatus.FAILED, None, "boom"),
        Slot(2, SlotStatus.SUCCEEDED, {"answer": 2}),
        Slot(0, SlotStatus.SUCCEEDED, {"answer": 0}),
    ]
    assert merge(d, state, ended) == {
        "results": [
            {"answer": 0},
            {"status": "failed", "error": "boom"},
            {"answer": 2},
            {"status": "cancelled", "error": "cancelled by the join"},
        ]
    }


def test_a_map_without_result_key_merges_under_its_state_name() -> None:
    d, state = state_of(mapping())
    assert merge(d, state, [Slot(0, SlotStatus.SUCCEEDED, {"answer": 1})]) == {
        "EACH": [{"answer": 1}]
    }


def test_an_empty_map_merges_an_empty_list() -> None:
    d, state = state_of(mapping(result_key="results"))
    assert merge(d, state, []) == {"results": []}


def test_a_child_machine_returns_its_one_result() -> None:
    d, state = state_of(CHILD_MACHINE)
    assert merge(d, state, [Slot(0, SlotStatus.SUCCEEDED, {"left": 1, "right": 2})]) == {
        "left": 1,
        "right": 2,
    }


# -- failure_of ---------------------------------------------------------------------------------


def test_a_failed_join_says_how_many_failed_against_what_it_tolerates() -> None:
    r = rule(parallel(3, tolerated=1), 3)
    slots = [Slot(0, SlotStatus.FAILED, None, "boom"), Slot(2, SlotStatus.FAILED, None, "bang")]
    assert failure_of(r, Tally(3, failed=2), slots) == (
        "2 of 3 children failed, 1 tolerated (#0: boom; #2: bang)"
    )


def test_a_failed_join_shows_the_first_three_errors() -> None:
    r = rule(mapping(), 5)
    slots = [Slot(i, SlotStatus.FAILED, None, f"e{i}") for i in range(5)]
    assert failure_of(r, Tally(5, failed=5), slots) == (
        "5 of 5 children failed, 0 tolerated (#0: e0; #1: e1; #2: e2; ...)"
    )


def test_a_failed_join_is_one_line_whatever_its_children_said() -> None:
    r = rule(mapping(), 2)
    slots = [Slot(0, SlotStatus.FAILED, None, "Traceback:\n  File x\nValueError: no\n")]
    text = failure_of(r, Tally(2, failed=1), slots)
    assert "\n" not in text
    assert text == "1 of 2 children failed, 0 tolerated (#0: Traceback: File x ValueError: no)"


def test_a_failed_join_without_errors_says_only_the_counts() -> None:
    r = rule(parallel(2), 2)
    slots = [Slot(0, SlotStatus.CANCELLED, None, "cancelled by an operator")]
    assert failure_of(r, Tally(2, failed=1), slots) == "1 of 2 children failed, 0 tolerated"


# -- properties: a fan-out driven as the engine drives it ---------------------------------------


@dataclass
class Run:
    """A fan-out as the engine drives it: its counts (the fan_outs row), its slots (the
    fan_out_items rows), the children still running, and what the join decided."""

    definition: MachineDefinition
    state: StateDefinition
    rule: Rule
    outcomes: list[SlotStatus]  # how each child ends: succeeded, failed, or cancelled by hand
    tally: Tally = field(default_factory=Tally)
    slots: list[SlotStatus] = field(default_factory=list)
    errors: dict[int, str] = field(default_factory=dict)
    live: set[int] = field(default_factory=set)  # children running (a join's cancel in flight)
    starts: Counter[int] = field(default_factory=Counter)
    ends: list[int] = field(default_factory=list)  # the children whose ends were counted
    most_running: int = 0
    decisions: list[tuple[Verdict, int, int]] = field(default_factory=list)  # (verdict, ok, ko)
    merged: dict[str, Any] | None = None

    @classmethod
    def open(cls, d: MachineDefinition, state: StateDefinition, outcomes: list[SlotStatus]) -> Run:
        run = cls(d, state, rule_for(state, len(outcomes)), outcomes)
        run.slots = [SlotStatus.WAITING] * len(outcomes)
        run.tally, start = opening(run.rule)
        run.start(start)
        if run.tally.verdict is not Verdict.PENDING:  # an empty map is met at once
            run.decide()
        return run

    def start(self, count: int) -> None:
        waiting = [i for i, s in enumerate(self.slots) if s is SlotStatus.WAITING][:count]
        assert len(waiting) == count, "child_ended started more items than wait"
        for i in waiting:
            self.slots[i] = SlotStatus.RUNNING
            self.live.add(i)
            self.starts[i] += 1
        self.most_running = max(self.most_running, len(self.live))

    def end(self, child: int) -> None:
        """A child's end reaches the engine: counted once, a redelivery dropped as stale."""
        if child not in self.live:
            return  # its attempt is answered already: the engine refuses it before counting
        self.live.remove(child)
        outcome = self.outcomes[child]
        before = self.tally
        settled = child_ended(self.rule, before, outcome is SlotStatus.SUCCEEDED)
        if before.verdict is not Verdict.PENDING:
            assert settled == Settled(before, 0, False)  # ended after the join: nothing counts
            return
        self.slots[child] = outcome
        self.errors[child] = f"child {child} {outcome.value}"
        self.ends.append(child)
        self.tally = settled.tally
        self.check_decision(settled)
        self.start(settled.start)
        if settled.decided:
            self.decide()

    def check_decision(self, settled: Settled) -> None:
        """The join is decided by exactly the end that makes it so, never before, never after."""
        ok = sum(self.slots[i] is SlotStatus.SUCCEEDED for i in self.ends)
        ko = len(self.ends) - ok
        assert (settled.tally.succeeded, settled.tally.failed) == (ok, ko)
        failed = ko > self.rule.tolerated
        met = ok + ko == self.rule.total if self.rule.waits_for_all else ok >= self.rule.need
        assert settled.decided == (failed or met)
        if settled.decided:
            assert settled.tally.verdict is (Verdict.FAILED if failed else Verdict.MET)

    def decide(self) -> None:
        """Carry out the decided join as the engine does: cancel the children still out, merge
        (when met) the slots as they then are."""
        out = sorted(i for i, s in enumerate(self.slots) if not s.finished)
        assert to_cancel(self.slot_rows()) == out
        for i in out:
            self.slots[i] = SlotStatus.CANCELLED
            self.errors[i] = "cancelled by the join"
        ok = sum(self.slots[i] is SlotStatus.SUCCEEDED for i in self.ends)
        self.decisions.append((self.tally.verdict, ok, len(self.ends) - ok))
        if self.tally.verdict is Verdict.MET:
            self.merged = merge(self.definition, self.state, self.slot_rows())

    def slot_rows(self) -> list[Slot]:
        """The slots in the order their children ended (the rest after), as a store might
        return them: whatever order merge is given, it must not show."""
        ended = self.ends + [i for i in range(len(self.slots)) if i not in self.ends]
        return [
            Slot(
                i,
                self.slots[i],
                {"n": i} if self.slots[i] is SlotStatus.SUCCEEDED else None,
                self.errors.get(i),
            )
            for i in ended
        ]


FanOut = tuple[MachineDefinition, StateDefinition, list[SlotStatus]]
Steps = list[tuple[int, bool]]

# One step: end a running child (picked among those running), or redeliver the end of one
# already ended (picked among those); a child's own outcome says how it ends.
STEPS = st.lists(st.tuples(st.integers(0, 1000), st.booleans()), max_size=40)
OUTCOMES = st.sampled_from([SlotStatus.SUCCEEDED, SlotStatus.FAILED, SlotStatus.CANCELLED])


def drive(
    d: MachineDefinition,
    state: StateDefinition,
    outcomes: list[SlotStatus],
    steps: list[tuple[int, bool]],
) -> Run:
    """Run the fan-out through the steps, then let every child still running end."""
    run = Run.open(d, state, outcomes)
    for pick, redeliver in steps:
        ended = sorted(set(run.ends) | {i for i, s in enumerate(run.slots) if s.finished})
        running = sorted(run.live)
        among = ended if redeliver else running
        if among:
            run.end(among[pick % len(among)])
        assert len(run.decisions) <= 1
        assert len(run.live) <= run.rule.max_concurrency
    while run.live:
        run.end(min(run.live))
    return run


@st.composite
def fan_outs(draw: st.DrawFn, joins: tuple[str, ...] = ("all", "any", "at_least", "map")) -> FanOut:
    """A fan-out state and how each of its children ends."""
    join = draw(st.sampled_from(joins))
    if join == "map":
        tolerated = draw(st.integers(0, 3) | st.sampled_from(["0%", "10%", "25%", "50%", "100%"]))
        d, state = fan_out_state(join, 0, tolerated, draw(st.integers(1, 5)))
        total = draw(st.integers(0, 12))
    else:
        total = draw(st.integers(1, 6))
        tolerated = draw(st.integers(0, total - 1)) if join == "all" else 0
        k = draw(st.integers(1, total)) if join == "at_least" else 0
        d, state = fan_out_state(join, total, tolerated, k)
    return d, state, draw(st.lists(OUTCOMES, min_size=total, max_size=total))


@cache
def fan_out_state(
    join: str, branches: int, tolerated: int | str, k_or_concurrency: int
) -> tuple[MachineDefinition, StateDefinition]:
    """A map, or a parallel state of the join given, built once (examples repeat them)."""
    if join == "map":
        return state_of(mapping(k_or_concurrency, tolerated))
    policy = {"at_least": k_or_concurrency} if join == "at_least" else join
    assert isinstance(tolerated, int)  # a percentage is a map's
    return state_of(parallel(branches, policy, tolerated))


@given(fan_out=fan_outs(), steps=STEPS)
@PROPERTY
def test_any_interleaving_decides_the_join_exactly_once(fan_out: FanOut, steps: Steps) -> None:
    run = drive(*fan_out, steps)
    assert len(run.decisions) == 1


@given(fan_out=fan_outs(), steps=STEPS)
@PROPERTY
def test_no_more_children_run_at_once_than_max_concurrency(fan_out: FanOut, steps: Steps) -> None:
    d, state, outcomes = fan_out
    run = drive(d, state, outcomes, steps)
    assert run.most_running <= run.rule.max_concurrency
    if state.map is not None:
        assert state.map.max_concurrency is not None
        assert run.most_running <= state.map.max_concurrency


@given(fan_out=fan_outs(), steps=STEPS)
@PROPERTY
def test_every_item_starts_at_most_once(fan_out: FanOut, steps: Steps) -> None:
    run = drive(*fan_out, steps)
    assert set(run.starts.values()) <= {1}
    assert run.tally.started == len(run.starts)


@given(fan_out=fan_outs(), steps=STEPS)
@PROPERTY
def test_the_verdict_depends_on_the_outcomes_not_their_order(fan_out: FanOut, steps: Steps) -> None:
    d, state, outcomes = fan_out
    run = drive(d, state, outcomes, steps)
    r = run.rule
    ok = outcomes.count(SlotStatus.SUCCEEDED)
    can_meet = len(outcomes) - ok <= r.tolerated if r.waits_for_all else ok >= r.need
    assert run.decisions[0][0] is (Verdict.MET if can_meet else Verdict.FAILED)


@given(fan_out=fan_outs(("all", "map")), steps=STEPS, others=STEPS)
@PROPERTY
def test_join_all_merges_the_same_output_in_any_order(
    fan_out: FanOut, steps: Steps, others: Steps
) -> None:
    d, state, outcomes = fan_out
    one, other = drive(d, state, outcomes, steps), drive(d, state, outcomes, others)
    in_order = drive(d, state, outcomes, [])
    assert one.decisions[0][0] is other.decisions[0][0] is in_order.decisions[0][0]
    assert json.dumps(one.merged) == json.dumps(other.merged) == json.dumps(in_order.merged)
    if one.merged is not None:
        assert SlotStatus.WAITING not in one.slots and SlotStatus.RUNNING not in one.slots


@given(fan_out=fan_outs(("any", "at_least")), steps=STEPS)
@PROPERTY
def test_any_and_at_least_are_met_as_soon_as_k_successes_are_in(
    fan_out: FanOut, steps: Steps
) -> None:
    run = drive(*fan_out, steps)
    verdict_, ok, ko = run.decisions[0]
    if verdict_ is Verdict.MET:
        assert ok == run.rule.need  # not one more: the join did not wait past the k-th
        assert run.merged is not None
        cancelled = [v for v in run.merged.values() if v.get("error") == "cancelled by the join"]
        assert len(cancelled) == len(run.slots) - ok - ko  # the children still out, each one
    else:
        assert ko == run.rule.tolerated + 1


@given(fan_out=fan_outs(), groups=st.lists(st.integers(1, 4), max_size=12))
@PROPERTY
def test_ends_counted_together_decide_as_ends_counted_one_by_one(
    fan_out: FanOut, groups: list[int]
) -> None:
    """Whatever ends one transaction brings together, the join is decided once, by the same
    end and with the same verdict as if they came one by one, and its counts are every end
    counted up to the deciding transaction's last."""
    _, state, outcomes = fan_out
    r = rule_for(state, len(outcomes))
    ends = [o is SlotStatus.SUCCEEDED for o in outcomes][: min(r.total, r.max_concurrency)]
    alone, alone_by = opening(r)[0], None
    for i, ok in enumerate(ends):
        settled = child_ended(r, alone, ok)
        alone, alone_by = settled.tally, i if settled.decided else alone_by
    tally, counted, decided = opening(r)[0], 0, []
    for size in groups or [len(ends)]:
        group = ends[counted : counted + size]
        together = ended_together(r, tally, group)
        if together.decider is not None:
            decided.append(counted + together.decider)
            assert together.tally.finished == counted + len(group)
        tally, counted = together.tally, counted + len(group)
    if counted >= len(ends):
        assert decided == ([] if alone_by is None else [alone_by])
        assert tally.verdict is alone.verdict
    assert len(decided) <= 1
