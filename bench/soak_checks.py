"""The soak's end checks (bench/soak.py): what PostgreSQL recorded, held against what every
definition allows and what the actors did (bench/soak_actors.py's journal).

`fetch` reads the records in one snapshot; every check after it is pure (plain rows in, a
Check out), so the checks' logic is tested on fabricated rows (tests/unit/test_soak.py).

- ended where defined: every machine in the status its definition leads to: completed, but a
  gate the approver rejected (failed); a gate nobody decided is a failure (the approver decides
  each one within a second or two), as is a machine still running after the drain (lost);
- one row per attempt: each machine's history, its rows of correction 0, holds each attempt
  once and skips none;
- ended once: after its last rewind, a machine's history has one row that ended it, its last;
- joined once: each fan-out decided once (met or failed, closed), one `join` row per decided
  fan-out, every slot's child ended, each child's own end recorded once;
- decided once: each gate closed with one verdict, at most one decision at it, one `approval`
  history row per gate that people decided, the approver's choice the one recorded;
- applied once: each soak_wait machine's event stored once (its key), applied, and one
  `signal` row in its history, however often it was sent;
- rewound and forked once: a rewind row per rewind the operator made (one more if its reply was
  lost), each fork with its source and one `fork` row.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Any
from uuid import UUID

from sqlalchemy import text
from sqlalchemy.engine import Engine

from bench.soak_actors import KINDS, Journal

TERMINAL = ("completed", "failed", "cancelled")
ENDS = ("DONE", "FAILED")  # every soak definition's terminal states
FAILURES_SHOWN = 5
Row = dict[str, Any]

QUERIES = {
    "machines": "SELECT id, type, status, current_state, parent_id, forked_from, attempt "
    "FROM state_machines",
    "history": "SELECT machine_id, attempt, correction, event, to_state, success "
    "FROM state_transitions ORDER BY machine_id, id",
    "fan_outs": "SELECT parent_id, attempt, verdict, total, closed_at IS NOT NULL AS closed "
    "FROM fan_outs",
    "items": "SELECT parent_id, attempt, slot, child_id, status FROM fan_out_items",
    "gates": "SELECT id, machine_id, attempt, verdict, closed_at IS NOT NULL AS closed "
    "FROM approval_gates",
    "decisions": "SELECT gate_id, machine_id, actor, decision FROM approval_decisions",
    "events": "SELECT machine_id, key, outcome FROM machine_events",
    "rejected": "SELECT reason, count(*) AS n FROM rejected_messages GROUP BY reason",
}


@dataclass
class Records:
    """What PostgreSQL recorded, as plain rows."""

    machines: list[Row] = field(default_factory=list)
    history: list[Row] = field(default_factory=list)
    fan_outs: list[Row] = field(default_factory=list)
    items: list[Row] = field(default_factory=list)
    gates: list[Row] = field(default_factory=list)
    decisions: list[Row] = field(default_factory=list)
    events: list[Row] = field(default_factory=list)
    rejected: list[Row] = field(default_factory=list)

    def history_of(self) -> dict[UUID, list[Row]]:
        found: dict[UUID, list[Row]] = defaultdict(list)
        for row in self.history:
            found[row["machine_id"]].append(row)
        return found


@dataclass
class Check:
    """One end check: how many things it looked at, and what it found wrong."""

    name: str
    checked: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures

    def fail(self, what: str) -> None:
        self.failures.append(what)

    def summary(self) -> dict[str, Any]:
        return {
            "passed": self.passed,
            "checked": self.checked,
            "failed": len(self.failures),
            "first_failures": self.failures[:FAILURES_SHOWN],
        }


def fetch(db: Engine) -> Records:
    """Every record the checks read, in one repeatable-read snapshot."""
    with db.connect() as conn:
        conn.execute(text("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"))
        found = {
            name: [dict(row._mapping) for row in conn.execute(text(query))]
            for name, query in QUERIES.items()
        }
    return Records(**found)


def kind_of(machine: Row) -> str:
    """The soak's name for a machine's kind: a child, a fork, or its definition's."""
    if machine["parent_id"] is not None:
        return "child"
    if machine["forked_from"] is not None:
        return "fork"
    by_type = {t: k for k, t in KINDS.items()}
    return by_type.get(machine["type"], "other")


def expected_status(machine: Row, journal: Journal) -> str:
    """The status a machine's definition leads it to, given what the approver chose."""
    if kind_of(machine) != "gate":
        return "completed"
    chosen = [c for (m, _), c in journal.choices.items() if m == machine["id"]]
    return "completed" if chosen and chosen[-1] == "approve" else "failed"


def check_ended_where_defined(records: Records, journal: Journal) -> Check:
    check = Check("ended where its definition says (nothing lost)")
    known = {m["id"] for m in records.machines}
    for machine_id in journal.started:
        if machine_id not in known:
            check.fail(f"{machine_id} ({journal.started[machine_id]}) was started, not stored")
    for machine in records.machines:
        check.checked += 1
        wanted, kind = expected_status(machine, journal), kind_of(machine)
        if machine["status"] not in TERMINAL:
            check.fail(
                f"{machine['id']} ({kind}) lost: still {machine['status']} at "
                f"{machine['current_state']} (attempt {machine['attempt']})"
            )
        elif machine["status"] != wanted:
            check.fail(f"{machine['id']} ({kind}) {machine['status']}, expected {wanted}")
    return check


def check_attempts_once(records: Records) -> Check:
    check = Check("one history row per attempt")
    for machine_id, rows in records.history_of().items():
        check.checked += 1
        attempts = [r["attempt"] for r in rows if r["correction"] == 0]
        doubled = sorted(a for a, n in Counter(attempts).items() if n > 1)
        if doubled:
            check.fail(f"{machine_id}: attempts {doubled} recorded more than once")
        ordered = sorted(set(attempts))
        if ordered and ordered != list(range(ordered[0], ordered[-1] + 1)):
            missing = sorted(set(range(ordered[0], ordered[-1] + 1)) - set(ordered))
            check.fail(f"{machine_id}: attempts {missing[:5]} missing from its history")
    return check


def _ending(row: Row) -> bool:
    return row["event"] == "cancel" or row["to_state"] in ENDS


def check_ended_once(records: Records) -> Check:
    check = Check("ended once (after its last rewind)")
    histories = records.history_of()
    for machine in records.machines:
        if machine["status"] not in TERMINAL:
            continue  # reported as lost
        check.checked += 1
        rows = histories.get(machine["id"], [])
        rewinds = [i for i, r in enumerate(rows) if r["event"] == "rewind"]
        since = rows[rewinds[-1] + 1 :] if rewinds else rows
        endings = [(r["event"], r["to_state"]) for r in since if _ending(r)]
        if len(endings) != 1:
            check.fail(f"{machine['id']} ended {len(endings)} times: {endings[:4]}")
        elif not _ending(since[-1]):
            check.fail(f"{machine['id']}: {since[-1]['event']} recorded after its end")
    return check


def check_joined_once(records: Records) -> Check:
    check = Check("each fan-out joined once, each child ended")
    joins = Counter(r["machine_id"] for r in records.history if r["event"] == "join")
    decided: Counter[UUID] = Counter()
    items: dict[tuple[UUID, int], list[Row]] = defaultdict(list)
    for item in records.items:
        items[(item["parent_id"], item["attempt"])].append(item)
    ended = {m["id"]: m["status"] for m in records.machines}
    for fan in records.fan_outs:
        check.checked += 1
        key = (fan["parent_id"], fan["attempt"])
        if fan["verdict"] in ("met", "failed"):
            decided[fan["parent_id"]] += 1
        elif fan["verdict"] != "closed":
            check.fail(f"fan-out {key}: verdict {fan['verdict']}")
        if not fan["closed"]:
            check.fail(f"fan-out {key} still open")
        _check_slots(check, key, fan["total"], items[key], ended)
    for parent in set(joins) | set(decided):
        if joins[parent] != decided[parent]:
            check.fail(f"{parent}: {joins[parent]} join rows, {decided[parent]} fan-outs decided")
    return check


def _check_slots(
    check: Check, key: tuple[UUID, int], total: int, slots: list[Row], ended: dict[UUID, str]
) -> None:
    """Every slot of the fan-out has its child, and the child ended."""
    if len(slots) != total:
        check.fail(f"fan-out {key}: {len(slots)} slots of {total}")
    for slot in slots:
        if slot["child_id"] is None or ended.get(slot["child_id"]) not in TERMINAL:
            check.fail(f"fan-out {key} slot {slot['slot']}: child {slot['child_id']} not ended")


def check_gates_decided_once(records: Records, journal: Journal) -> Check:
    check = Check("each gate decided once")
    at_gate = Counter(d["gate_id"] for d in records.decisions)
    by_person = {(d["machine_id"], d["gate_id"]): d["decision"] for d in records.decisions}
    approvals = Counter(r["machine_id"] for r in records.history if r["event"] == "approval")
    people: Counter[UUID] = Counter()
    for gate in records.gates:
        check.checked += 1
        key = (gate["machine_id"], gate["attempt"])
        if gate["verdict"] == "pending" or not gate["closed"]:
            check.fail(f"gate {gate['id']} of {gate['machine_id']} still open ({gate['verdict']})")
        if at_gate[gate["id"]] > 1:
            check.fail(f"gate {gate['id']}: {at_gate[gate['id']]} decisions")
        if gate["verdict"] in ("approved", "rejected"):
            people[gate["machine_id"]] += 1
        recorded = [d for d in journal.decisions.get(key, []) if d.get("recorded")]
        if len(recorded) > 1:
            check.fail(f"gate {gate['id']}: the approver's decision recorded {len(recorded)} times")
        made = by_person.get((gate["machine_id"], gate["id"]))
        if made is not None and made != journal.choices.get(key):
            chosen = journal.choices.get(key)
            check.fail(f"gate {gate['id']}: {made} recorded, the approver chose {chosen}")
    for machine_id in set(approvals) | set(people):
        if approvals[machine_id] != people[machine_id]:
            check.fail(
                f"{machine_id}: {approvals[machine_id]} approval rows for {people[machine_id]} "
                "gates decided by people"
            )
    return check


def check_events_applied_once(records: Records, journal: Journal) -> Check:
    check = Check("each event applied once")
    stored: dict[UUID, list[Row]] = defaultdict(list)
    for event in records.events:
        stored[event["machine_id"]].append(event)
    signals = Counter(r["machine_id"] for r in records.history if r["event"] == "signal")
    waits = [m["id"] for m in records.machines if kind_of(m) == "wait"]
    for machine_id in waits:
        check.checked += 1
        outcomes = [e["outcome"] for e in stored[machine_id]]
        if outcomes != ["applied"]:
            check.fail(f"{machine_id}: events stored {outcomes}, expected one applied")
        if signals[machine_id] != 1:
            check.fail(f"{machine_id}: {signals[machine_id]} signal rows")
        sent = journal.events.get(machine_id, [])
        if not sent:
            check.fail(f"{machine_id}: the sender never had an answer")
        elif sent[1:] and set(sent[1:]) != {"duplicate"}:
            check.fail(f"{machine_id}: a resend under the same key answered {sent[1:]}")
    return check


def check_operator_once(records: Records, journal: Journal) -> Check:
    check = Check("each rewind and fork recorded once")
    rewinds = Counter(r["machine_id"] for r in records.history if r["event"] == "rewind")
    forked = {m["id"]: m["forked_from"] for m in records.machines if m["forked_from"]}
    fork_rows = Counter(r["machine_id"] for r in records.history if r["event"] == "fork")
    for machine_id in set(rewinds) | set(journal.rewinds):
        check.checked += 1
        made = len(journal.rewinds.get(machine_id, []))
        allowed = {made, made + 1} if machine_id in journal.uncertain else {made}
        if rewinds[machine_id] not in allowed:
            check.fail(f"{machine_id}: {rewinds[machine_id]} rewind rows, {made} rewinds made")
    for fork, source in journal.forks.items():
        check.checked += 1
        if forked.get(fork) != source:
            check.fail(f"fork {fork}: forked_from {forked.get(fork)}, expected {source}")
        if fork_rows[fork] != 1:
            check.fail(f"fork {fork}: {fork_rows[fork]} fork rows")
    unexplained = set(forked) - set(journal.forks)
    for fork in unexplained:
        if forked[fork] not in journal.uncertain:
            check.fail(f"fork {fork} of {forked[fork]}: no fork was asked")
    return check


def run_checks(records: Records, journal: Journal) -> list[Check]:
    """Every end check, in the order the report lists them."""
    return [
        check_ended_where_defined(records, journal),
        check_attempts_once(records),
        check_ended_once(records),
        check_joined_once(records),
        check_gates_decided_once(records, journal),
        check_events_applied_once(records, journal),
        check_operator_once(records, journal),
    ]


def where_ended(records: Records) -> dict[str, dict[str, int]]:
    """Per kind, how many machines ended in each status and state."""
    found: dict[str, Counter[str]] = defaultdict(Counter)
    for machine in records.machines:
        found[kind_of(machine)][f"{machine['status']}@{machine['current_state']}"] += 1
    return {kind: dict(sorted(c.items())) for kind, c in sorted(found.items())}
