"""The join of a fan-out: when its children's ends meet it, which children it cancels, which
items of a map start next, and the output it merges. Pure: the engine stores the counts (the
fan_outs row) and the slots (fan_out_items), and writes what these functions return, in the
transaction that applies a child's last transition (docs/fan-out.md)."""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from enum import StrEnum
from typing import Any

from fsm_celery.core.definition import AtLeast, MachineDefinition, StateDefinition


class Kind(StrEnum):
    """What a fan-out starts."""

    PARALLEL = "parallel"  # one child per named branch
    MAP = "map"  # one child per element of a list
    MACHINE = "machine"  # one child machine of another definition


class Verdict(StrEnum):
    """Where a join stands."""

    PENDING = "pending"  # children still decide it
    MET = "met"  # the parent moves on with the merged output
    FAILED = "failed"  # the parent takes its failure edge
    CLOSED = "closed"  # the parent left the state another way (timed out, cancelled, forced)


class SlotStatus(StrEnum):
    """Where one child of a fan-out is."""

    WAITING = "waiting"  # a map item not started yet (max_concurrency)
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    CANCELLED = "cancelled"  # by the join, by its parent, or by an operator

    @property
    def finished(self) -> bool:
        return self not in (SlotStatus.WAITING, SlotStatus.RUNNING)


@dataclass(frozen=True)
class Rule:
    """How a fan-out of `total` children is joined."""

    total: int
    need: int  # successes that meet it as soon as they are in (any, at_least)
    tolerated: int  # failures past which it cannot be met
    waits_for_all: bool  # join: all (and maps): met only once every child has finished
    max_concurrency: int  # children running at once (a map's; the rest wait their turn)


def kind_of(state: StateDefinition) -> Kind:
    if state.parallel is not None:
        return Kind.PARALLEL
    if state.map is not None:
        return Kind.MAP
    return Kind.MACHINE


def rule_for(state: StateDefinition, total: int) -> Rule:
    """The join rule of a fan-out state over `total` children."""
    if state.parallel is not None:
        join = state.parallel.join
        if isinstance(join, AtLeast):
            return Rule(total, join.at_least, total - join.at_least, False, total)
        if join == "any":
            return Rule(total, 1, total - 1, False, total)
        tolerated = state.parallel.tolerated_failures
        return Rule(total, total - tolerated, tolerated, True, total)
    if state.map is not None:
        tolerated = tolerated_of(state.map.tolerated_failures, total)
        concurrency = state.map.max_concurrency or max(total, 1)
        return Rule(total, total - tolerated, tolerated, True, concurrency)
    return Rule(total, total, 0, True, total)


def tolerated_of(tolerated: int | str, total: int) -> int:
    """A count of tolerated failures, from a count or a percentage of the items (rounded
    down: 10% of 15 items tolerates one failure, not two)."""
    if isinstance(tolerated, int):
        return tolerated
    return math.floor(float(tolerated.rstrip("%")) * total / 100 + 1e-9)


@dataclass(frozen=True)
class Tally:
    """A fan-out's counts (its fan_outs row)."""

    started: int = 0
    succeeded: int = 0
    failed: int = 0  # cancelled children count here too: they did not succeed
    verdict: Verdict = Verdict.PENDING

    @property
    def finished(self) -> int:
        return self.succeeded + self.failed

    @property
    def running(self) -> int:
        return self.started - self.finished


def verdict(rule: Rule, tally: Tally) -> Verdict:
    """Whether the counts meet the join, fail it, or leave it to the children still out."""
    if tally.failed > rule.tolerated:
        return Verdict.FAILED
    if rule.waits_for_all:
        return Verdict.MET if tally.finished >= rule.total else Verdict.PENDING
    return Verdict.MET if tally.succeeded >= rule.need else Verdict.PENDING


def opening(rule: Rule) -> tuple[Tally, int]:
    """A new fan-out's counts and how many children it starts now (an empty map is met at
    once)."""
    start = min(rule.total, rule.max_concurrency)
    tally = Tally(started=start)
    return replace(tally, verdict=verdict(rule, tally)), start


@dataclass(frozen=True)
class Settled:
    """What one child's end does to its fan-out."""

    tally: Tally
    start: int  # map items to start now, each in a slot freed
    decided: bool  # the join was decided by this end (met or failed): exactly once


def child_ended(rule: Rule, tally: Tally, succeeded: bool) -> Settled:
    """Count a child's end. A fan-out already decided counts nothing more (a child that ends
    after the join, or is cancelled by it, does not move its parent twice)."""
    if tally.verdict is not Verdict.PENDING:
        return Settled(tally, 0, False)
    # Tallies built, not dataclasses.replace'd (three times slower): a map counts every end
    ok, failed = tally.succeeded + succeeded, tally.failed + (not succeeded)
    counted = Tally(tally.started, ok, failed)
    decided = verdict(rule, counted)
    if decided is not Verdict.PENDING:
        return Settled(Tally(counted.started, ok, failed, decided), 0, True)
    start = max(min(rule.total - counted.started, rule.max_concurrency - counted.running), 0)
    return Settled(Tally(counted.started + start, ok, failed), start, False)


@dataclass(frozen=True)
class Together:
    """What the ends of a fan-out's children that one transaction brings together do to it."""

    tally: Tally
    start: int  # map items to start now (none once the join is decided)
    decider: int | None  # the position of the end that decided the join, if one did


def ended_together(rule: Rule, tally: Tally, succeeded: Sequence[bool]) -> Together:
    """Count the ends one transaction brings together, in order: the first to decide the join
    decides it, and those after it are counted as what they are too (a child that completed in
    the transaction that met the join is a success, not a loser to cancel). A fan-out decided
    before counts nothing more; no item starts in a slot freed by an end that a decided join
    would cancel at once."""
    if tally.verdict is not Verdict.PENDING:
        return Together(tally, 0, None)
    start, decider = 0, None
    for position, ok in enumerate(succeeded):
        if decider is None:
            settled = child_ended(rule, tally, ok)
            tally, start = settled.tally, start + settled.start
            decider = position if settled.decided else None
        else:
            tally = replace(tally, succeeded=tally.succeeded + ok, failed=tally.failed + (not ok))
    if decider is not None:
        tally, start = replace(tally, started=tally.started - start), 0
    return Together(tally, start, decider)


@dataclass(frozen=True)
class Slot:
    """One child's place in a fan-out (a fan_out_items row)."""

    index: int
    status: SlotStatus
    result: Mapping[str, Any] | None = None
    error: str | None = None


def to_cancel(slots: Iterable[Slot]) -> list[int]:
    """The slots a decided join cancels: every child still running or waiting its turn."""
    return [slot.index for slot in slots if not slot.status.finished]


def merge(
    definition: MachineDefinition, state: StateDefinition, slots: Iterable[Slot]
) -> dict[str, Any]:
    """The output a join hands its parent, in the definition's order whatever the order the
    children ended in: each branch's result under its name, a map's results in item order
    under its result_key (a failed or cancelled one as a record of what happened in its
    slot), a child machine's result as it is."""
    by_index = {slot.index: slot for slot in slots}
    kind = kind_of(state)
    if kind is Kind.MACHINE:
        only = by_index.get(0)
        return dict(only.result or {}) if only is not None else {}
    if kind is Kind.PARALLEL:
        assert state.parallel is not None
        names = [branch.name for branch in state.parallel.branches]
        return {name: _value(by_index[i]) for i, name in enumerate(names) if i in by_index}
    assert state.map is not None
    ordered = [_value(by_index[i]) for i in sorted(by_index)]
    return {state.map.result_key or state.name: ordered}


def _value(slot: Slot) -> Any:
    if slot.status is SlotStatus.SUCCEEDED:
        return dict(slot.result or {})
    record: dict[str, Any] = {"status": slot.status.value}
    if slot.error is not None:
        record["error"] = slot.error
    return record


def failure_of(rule: Rule, tally: Tally, slots: Iterable[Slot]) -> str:
    """Why a join failed, in one line: how many failed against what it tolerates, and the first
    failures' errors (an agent's error may span lines: its whitespace is folded)."""
    errors = [
        f"#{s.index}: {' '.join(s.error.split())}"
        for s in slots
        if s.status is SlotStatus.FAILED and s.error
    ]
    shown = "; ".join(errors[:3]) + ("; ..." if len(errors) > 3 else "")
    text = f"{tally.failed} of {rule.total} children failed, {rule.tolerated} tolerated"
    return f"{text} ({shown})" if shown else text


def describe(state: StateDefinition, rule: Rule, tally: Tally, cancelled: int) -> str:
    """What a join was, in one line for the parent's history: its children, its policy, how
    they ended and how many it cancelled."""
    kind = kind_of(state)
    if state.parallel is not None:
        join = state.parallel.join
        policy = f"at_least {join.at_least}" if isinstance(join, AtLeast) else join
    else:
        policy = "all" if kind is Kind.MAP else "the child"
    concurrency = f", {rule.max_concurrency} at a time" if rule.max_concurrency < rule.total else ""
    return (
        f"{kind.value} of {rule.total} ({policy}, {rule.tolerated} failures tolerated"
        f"{concurrency}): {tally.succeeded} succeeded, {tally.failed} failed"
        + (f", {cancelled} cancelled by the join" if cancelled else "")
    )
