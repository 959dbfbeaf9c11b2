"""Replay over recorded machines (PostgreSQL): 200 machines of each shipped definition run by
the engine with agents that answer at random (successes with random guard values, failures,
answers missing a required key, silence until the deadline, approvals and rejections, the
children of fan-outs), then replayed from what their history recorded. The unchanged
definition takes every one's path; a negated guard (a newly required key, for the definition
with no guard) diverges at exactly the step it changes, which an oracle finds in the history
by itself; the CLI's `definitions check --replay-last` says the same."""

from __future__ import annotations

import random
import re
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from uuid import UUID

import pytest
from click.testing import CliRunner
from sqlalchemy import select

from fsm_celery.agent.mock import InjectedFailure, MockScript
from fsm_celery.api import default_client
from fsm_celery.cli import main
from fsm_celery.config import get_settings
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.gate import Choice, Vote
from fsm_celery.core.loader import SHIPPED_DEFINITIONS, load_file, load_text
from fsm_celery.core.replay import Outcome
from fsm_celery.engine import Next
from fsm_celery.engine.approvals import ADMIN
from fsm_celery.exceptions import GateClosed
from fsm_celery.store import queries as q
from fsm_celery.store.tables import machines
from tests.inprocess.conftest import Fsm, ack

# 200 roots of each definition (and their children) meet every kind of answer the agents draw,
# many times each: success, failure, refusal, silence, approval and rejection, a join.
# 1,000 proved nothing more (the same kinds of paths, five times each) and took the file to
# half an hour beside the suite's other processes; tests/unit/test_replay.py draws random runs'
# paths (hypothesis) without a database.
MACHINES = 200
BATCH = 250
CONTEXTS: dict[str, dict[str, Any]] = {
    "cto_build_parallel": {"projectName": "sla-api", "githubIssue": 7},
    "cto_build_project": {"projectName": "sla-api", "githubIssue": 7},
    "cto_fix_bug": {"projectName": "sla-api", "githubIssue": 7},
    "cto_infrastructure_check": {},
    "research_fanout": {"query": "durable agents"},
    "research_pipeline": {"taskState": {"query": "durable agents"}},
}
TYPES = sorted(CONTEXTS)
EVENTS = {"start", "ack", "timeout"}  # each run's answers, failures, refusals and silences
MORE_EVENTS = {
    "cto_build_project": {"approval"},
    "cto_build_parallel": {"join"},
    "research_fanout": {"join"},
}


def guard_keys(d: MachineDefinition) -> set[str]:
    found: set[str] = set()
    for s in d.states:
        for e in (*s.on_success, *s.on_approve, *s.on_reject, *s.on_event):
            found.update(re.findall(r"output\.(\w+)", e.when or ""))
    return found


class RandomAgents:
    """Every agent type's answers: the mock's outputs, with guard keys drawn at random, and
    failures, refused answers and silence mixed in."""

    def __init__(self, fsm: Fsm, d: MachineDefinition, seed: int) -> None:
        self.fsm = fsm
        self.d = d
        self.rng = random.Random(seed)
        self.script = MockScript(seed=seed)
        self.guards = guard_keys(d)
        self.agents = [fsm.agent(name) for name in sorted(self._agent_types(d))]

    def _agent_types(self, d: MachineDefinition) -> set[str]:
        found = {d.agent_type, *(s.agent_type for s in d.states if s.agent_type)}
        for s in d.states:
            for child in _children(d, s.name):
                found |= self._agent_types(child)
        return found

    def answers(self) -> list[dict[str, Any]]:
        """The answers to the state_tasks sent since the last call (silence left out)."""
        found = []
        for agent in self.agents:
            for task in agent.tasks():
                answer = self._answer(task)
                if answer is not None:
                    found.append(answer)
        self.rng.shuffle(found)
        return found

    def _answer(self, task: dict[str, Any]) -> dict[str, Any] | None:
        roll = self.rng.random()
        if roll < 0.03:
            return None  # silent: its deadline decides
        if roll < 0.10:
            return ack(task, success=False, error="the agent gave up")
        try:
            output = self.script.respond(
                task["machineId"], task["state"], task["machineType"], task["context"]
            )
        except (InjectedFailure, KeyError):
            output = {}
        state = self.d.at(task["machineType"]).state(task["state"])
        for key in state.required_output:  # what it was given back (a TaskState), or a note
            output.setdefault(key, task["context"].get(key, {"note": key}))
        for key in self.guards & set(output) | self.guards & set(state.required_output):
            output[key] = self.rng.random() < 0.6
        if roll < 0.14 and state.required_output:
            del output[self.rng.choice(state.required_output)]  # refused: a key missing
        return ack(task, output=output)


def _children(d: MachineDefinition, state: str) -> Iterator[MachineDefinition]:
    s = d.state(state)
    if s.parallel is not None:
        for branch in s.parallel.branches:
            yield d.at(f"{d.type}.{state}.{branch.name}")
    if s.map is not None or s.machine is not None:
        yield d.at(f"{d.type}.{state}")


def run(fsm: Fsm, d: MachineDefinition, count: int, seed: int) -> list[UUID]:
    """Start `count` machines of the definition and drive them until every one has ended."""
    agents = RandomAgents(fsm, d, seed)
    rng = agents.rng
    ids = []
    for i in range(count):
        context = dict(CONTEXTS[d.type])
        if d.type == "cto_build_project":
            context["approveProduction"] = i % 2 == 0
        ids.append(fsm.start(d.type, context))
    delayed: Next = []
    for _ in range(400):
        answers = agents.answers()
        for i in range(0, len(answers), BATCH):
            delayed += enter(fsm, fsm.receive(*answers[i : i + BATCH]))
        if answers:
            continue
        if decide_gates(fsm, rng):
            continue
        if delayed:  # retries waiting out their backoff
            fsm.clock.advance(301)
            steps, delayed = delayed, []
            delayed += enter(fsm, [step._replace(delay=0.0) for step in steps])
            continue
        if not running(fsm):
            return ids
        fsm.clock.advance(100_000)  # every deadline passes: the silent attempts, open gates
        for _ in range(10):
            delayed += enter(fsm, fsm.scan())
    raise AssertionError("the machines did not end")


def enter(fsm: Fsm, steps: Next) -> Next:
    """Enter the steps due (and the first states of the children they start); the delayed."""
    later: Next = []
    while steps:
        now = [s for s in steps if not s.delay]
        later += [s for s in steps if s.delay]
        steps = [n for s in now for n in fsm.engine.entry.enter(s.machine_id, s.attempt)]
    return later


def decide_gates(fsm: Fsm, rng: random.Random) -> bool:
    """Approve or reject four in five of the open gates (the rest wait out their deadline)."""
    with fsm.engine.db.connect() as conn:
        gated = conn.execute(
            select(machines.c.id).where(
                machines.c.status == "running", machines.c.current_state == "APPROVE_PROD"
            )
        ).all()
    decided = False
    for (mid,) in gated:
        if rng.random() < 0.2:
            continue
        choice = Choice.APPROVE if rng.random() < 0.7 else Choice.REJECT
        try:
            fsm.engine.approvals.decide(mid, Vote("alice", choice, {"note": "seen"}), ADMIN)
            decided = True
        except GateClosed:
            pass
    return decided


def running(fsm: Fsm) -> bool:
    with fsm.engine.db.connect() as conn:
        return (
            conn.execute(
                select(machines.c.id).where(machines.c.status.in_(["running", "paused"]))
            ).first()
            is not None
        )


def changed(d: MachineDefinition) -> tuple[MachineDefinition, str, str]:
    """The definition with its first guard negated (a new required key, where it has no
    guard): the changed definition, the state it changes, and what the divergence names."""
    text = (SHIPPED_DEFINITIONS / f"{d.type}.yaml").read_text()
    for s in d.states:
        for e in s.on_success:
            if e.when is not None:
                line = f"when: {e.when}\n"
                assert text.count(line) == 1
                negated = text.replace(line, f'when: "!({e.when})"\n')
                return load_text(negated), s.name, f"guard '!({e.when})'"
    first = next(s for s in d.states if s.required_output)
    key = first.required_output[0]
    at = text.index(f"name: {first.name}\n")
    tail = re.sub(rf"required_output: \[{key}", f"required_output: [ticketUrl, {key}", text[at:])
    return load_text(text[:at] + tail), first.name, "missing required output: ticketUrl"


def expected_divergence(fsm: Fsm, mid: UUID, state: str) -> int | None:
    """The oracle: the first step the change decides elsewhere is the first answer at the
    changed state that the definition took as a success (a negated guard flips every such
    choice between two places; a new required key refuses every such answer)."""
    for r in fsm.history(mid):
        if r.event == "ack" and r.from_state == state and r.success:
            return r.attempt
    return None


# The suite's limit is 300 s a test, for hangs: the fan-out definitions' case (200 roots and
# their children driven to their ends, then replayed twice) takes under a minute beside the
# suite's other processes on two cores; a machine at a third of that speed (a CI run met one)
# is given room.
@pytest.mark.timeout(900)
@pytest.mark.parametrize("machine_type", TYPES)
def test_replay_over_hundreds_of_recorded_machines(fsm: Fsm, machine_type: str) -> None:
    d = load_file(SHIPPED_DEFINITIONS / f"{machine_type}.yaml")
    ids = run(fsm, d, MACHINES, seed=TYPES.index(machine_type))
    replays = fsm.engine.replays.last(d, MACHINES)
    assert {r.machine_id for r in replays} == set(ids)
    with fsm.engine.db.connect() as conn:
        created = conn.execute(
            select(machines.c.id, machines.c.created_at).where(machines.c.id.in_(ids))
        )
        histories = q.histories_txn(conn, {row.id: row.created_at for row in created})
        children = conn.execute(select(machines.c.id).where(machines.c.root_id.in_(ids[:100])))
        child_ids = [c.id for c in children]
    events = Counter(r.event for rows in histories.values() for r in rows)
    assert EVENTS | MORE_EVENTS.get(machine_type, set()) <= set(events), events
    differ = [r for r in replays if r.replay.outcome is not Outcome.SAME]
    assert not differ, [(r.machine_id, r.replay.why) for r in differ[:5]]
    assert all(r.replay.status == r.status for r in replays)
    # a step each row but the answers refused (each corrected, or its attempt ended, after it)
    steps = {mid: [h for h in rows if h.event != "refused"] for mid, rows in histories.items()}
    assert "refused" in events
    assert all(len(r.replay.steps) == len(steps[r.machine_id]) for r in replays)
    for child in child_ids:  # a fan-out's children: machines of their own, replayed alone
        found = fsm.engine.replays.machine(child)
        assert found.replay.outcome is Outcome.SAME, (child, found.replay.why)
    assert bool(child_ids) is (machine_type in MORE_EVENTS and "join" in MORE_EVENTS[machine_type])

    negated, state, named = changed(d)
    diverged = 0
    for found in fsm.engine.replays.last(negated, MACHINES):
        at = expected_divergence(fsm, found.machine_id, state)
        if at is None:
            assert found.replay.outcome is Outcome.SAME, found.replay.why
            continue
        diverged += 1
        assert found.replay.outcome is Outcome.DIVERGED, found.replay.why
        assert found.replay.at == at, (found.machine_id, found.replay.why, at)
        assert named in (found.replay.why or ""), found.replay.why
    assert diverged > MACHINES // 4


def test_cli_replay_and_definitions_check(
    fsm: Fsm, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    d = load_file(SHIPPED_DEFINITIONS / "cto_fix_bug.yaml")
    ids = run(fsm, d, 40, seed=99)
    negated, _, _ = changed(d)
    path = tmp_path / "cto_fix_bug.yaml"
    text = (SHIPPED_DEFINITIONS / "cto_fix_bug.yaml").read_text()
    path.write_text(text.replace("when: output.passed\n", 'when: "!(output.passed)"\n'))
    assert negated.state("RUN_TESTS").on_success[0].when == "!(output.passed)"
    settings = fsm.settings
    for name in ("database_url", "redis_url", "task_token_secret", "channel_prefix", "queue"):
        monkeypatch.setenv(f"FSM_{name.upper()}", str(getattr(settings, name)))
    get_settings.cache_clear()
    default_client.cache_clear()
    try:
        runner = CliRunner()
        same = runner.invoke(main, ["replay", str(ids[0])])
        assert same.exit_code == 0, same.output
        assert "same path:" in same.output and "replayed against v1" in same.output
        check = runner.invoke(main, ["definitions", "check", str(path), "--replay-last", "40"])
        assert check.exit_code == 1, check.output
        assert "replayed the last 40 ended cto_fix_bug machines" in check.output
        assert "at RUN_TESTS: the run -> COMMIT_PUSH, now -> WRITE_FIX" in check.output
        assert "guard '!(output.passed)'" in check.output
        unchanged = SHIPPED_DEFINITIONS / "cto_fix_bug.yaml"
        ok = runner.invoke(main, ["definitions", "check", str(unchanged), "--replay-last", "40"])
        assert ok.exit_code == 0, ok.output
        assert "40 same path, 0 diverge" in ok.output
        both = runner.invoke(
            main, ["replay", str(ids[0]), "--version", "1", "--definition", str(path)]
        )
        assert both.exit_code == 2 and "not both" in both.output
        missing = runner.invoke(main, ["replay", str(ids[0]), "--version", "9"])
        assert missing.exit_code == 1 and "cto_fix_bug has no version 9" in missing.output
        other = SHIPPED_DEFINITIONS / "cto_build_project.yaml"
        wrong = runner.invoke(main, ["replay", str(ids[0]), "--definition", str(other)])
        assert (
            wrong.exit_code == 1 and "the definition given is a cto_build_project" in wrong.output
        )
    finally:
        if default_client.cache_info().currsize:
            default_client().engine.db.dispose()
        default_client.cache_clear()
        get_settings.cache_clear()
