"""Approval gates: a state that waits for people, not an agent. Pure.

A gate names the groups of people who may decide (`approvers`), how many approvals open it
(`quorum`: a number, or `all` of the groups' members), how many rejections close it
(`rejections`, 1 by default: one person can stop a deploy), and the form a decision fills in
(`schema`, a JSON Schema of its fields). The state's `timeout` is the gate's deadline, and its
`on_timeout` says what a deadline decides: `approve`, `reject`, or a state to escalate to. Each
person decides once per gate; the votes are counted in the transaction that records one
(fsm_celery.engine.approvals), so a quorum is met exactly once, however many doors decide at once.
Only approvers vote, each as the name they authenticated with; an admin's (or the CLI's)
decision is an override: it decides the gate outright and is counted as nobody's vote.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import timedelta
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from fsm_celery.core.context import context_problem

DEFAULT_TIMEOUT = timedelta(days=1)  # an approval state's, when its definition names none
APPROVE, REJECT = "approve", "reject"
SUMMARY_KEY = "approval"  # the output key that says how a gate was decided
COMMENT_CHARS = 2000
MAX_FIELDS_BYTES = 16_384  # a decision's fields, as JSON


class Approval(BaseModel):
    """Who decides at an approval state, and how their decisions are counted."""

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)

    approvers: tuple[str, ...] = Field(min_length=1, max_length=20)
    quorum: int | Literal["all"] = 1
    rejections: int = Field(default=1, ge=1, le=1000)
    form: dict[str, Any] | None = Field(default=None, alias="schema")


class Choice(StrEnum):
    APPROVE = APPROVE
    REJECT = REJECT


class Verdict(StrEnum):
    PENDING = "pending"
    APPROVED = "approved"
    REJECTED = "rejected"


@dataclass(frozen=True)
class Vote:
    """One person's decision at a gate, with where it came from."""

    actor: str
    choice: Choice
    fields: Mapping[str, Any]
    comment: str = ""
    via: str = "api"  # api, dashboard, cli, client, github


@dataclass(frozen=True)
class Count:
    """A gate's decisions so far, and what they add up to."""

    approvals: int
    rejections: int
    needed: int  # approvals that open it
    verdict: Verdict


def needed(approval: Approval, members: int) -> int:
    """The approvals that open the gate: its quorum, or every member of its groups (at least
    one: a gate whose groups are empty waits for an admin, or its deadline)."""
    if approval.quorum == "all":
        return max(members, 1)
    return approval.quorum


def count(approval: Approval, members: int, approvals: int, rejections: int) -> Count:
    """What the decisions recorded at a gate decide: approved once the quorum approved,
    rejected once `rejections` people rejected (whichever the last decision reached)."""
    wanted = needed(approval, members)
    if rejections >= approval.rejections:
        verdict = Verdict.REJECTED
    elif approvals >= wanted:
        verdict = Verdict.APPROVED
    else:
        verdict = Verdict.PENDING
    return Count(approvals, rejections, wanted, verdict)


def members_of(groups: Mapping[str, Iterable[str]], approval: Approval) -> set[str]:
    """The people who may decide at the gate: the members of its groups."""
    return {person for group in approval.approvers for person in groups.get(group, ())}


def fields_problem(approval: Approval, vote: Vote) -> str | None:
    """Why the vote's fields do not fill in the gate's form, or None. A rejection need not
    fill in what an approval must: its fields are checked without the form's `required`."""
    if approval.form is None:
        return None if not vote.fields else "this gate asks for no fields"
    form = approval.form
    if vote.choice is Choice.REJECT:
        form = {k: v for k, v in form.items() if k != "required"}
    return context_problem(form, vote.fields)


def overridden(choice: Choice) -> Verdict:
    """The verdict of an override (an admin's or the CLI's decision): the gate, outright."""
    return Verdict.APPROVED if choice is Choice.APPROVE else Verdict.REJECTED


def declared(approval: Approval, fields: Mapping[str, Any]) -> dict[str, Any]:
    """The fields the gate's form declares (its `properties`): only these reach the context,
    whatever else a form that allows more was sent."""
    properties = (approval.form or {}).get("properties")
    if not isinstance(properties, Mapping):
        return {}
    return {k: v for k, v in fields.items() if k in properties}


def summary(verdict: Verdict, votes: Iterable[tuple[str, str, str, bool]]) -> dict[str, Any]:
    """The `approval` output of a gate decided by people: the verdict, and who decided what
    (actor, choice, comment; `override: true` on an admin's), oldest first."""
    decisions = [
        {"actor": actor, "decision": choice, "comment": comment} | ({"override": True} if o else {})
        for actor, choice, comment, o in votes
    ]
    return {SUMMARY_KEY: {"verdict": verdict.value, "decisions": decisions}}


def timed_out(verdict: Verdict) -> dict[str, Any]:
    """The `approval` output of a gate its deadline decided."""
    return {SUMMARY_KEY: {"verdict": verdict.value, "decisions": [], "timedOut": True}}
