"""The engine's use cases against real PostgreSQL and Redis, one test's process (see conftest)."""

from __future__ import annotations

import json
import threading
import uuid

import pytest

from fsm_celery.core.admin import Action, Command
from fsm_celery.core.loader import parse_definition
from fsm_celery.core.messages import task_token
from fsm_celery.engine import Inbound
from fsm_celery.exceptions import CommandRefused
from fsm_celery.store import agents as agent_store
from tests.inprocess.conftest import Fsm, ack
from tests.support.credentials import TEST_SECRET
from tests.support.messages import FIX_BUG_STATES, heartbeat_for

CONTEXT = {"projectName": "sla-api", "bugDescription": "login fails", "githubIssue": 7}


def test_a_machine_runs_to_completion_on_the_tasks_read_back_from_redis(fsm: Fsm) -> None:
    agent_id = uuid.uuid4()
    agent = fsm.agent(str(agent_id))
    mid = fsm.start("cto_fix_bug", CONTEXT, agent_id=agent_id)
    while (task := agent.tasks()) and fsm.machine(mid).status == "running":
        [one] = task
        assert (one["machineId"], one["type"]) == (str(mid), "state_task")
        assert one["taskToken"] and one["deadline"] and one["prompt"]
        fsm.clock.advance(0.25)
        assert fsm.receive(ack(one)) == []  # inline: the next state is entered at once
    machine = fsm.machine(mid)
    assert (machine.status, machine.current_state) == ("completed", "COMPLETE")
    history = fsm.history(mid)
    assert [h.to_state for h in history] == FIX_BUG_STATES
    assert [h.attempt for h in history] == list(range(len(FIX_BUG_STATES)))
    assert [h.duration_ms for h in history[1:]] == [250] * (len(FIX_BUG_STATES) - 1)
    assert [t["state"] for t in agent.seen] == FIX_BUG_STATES[:-1]  # one task per state


def test_the_same_ack_moves_a_machine_once_however_it_arrives(fsm: Fsm) -> None:
    mid = fsm.start("test_linear")
    agent = fsm.agent("tester")  # unassigned: the agent type's stream
    task = agent.task()
    answer = json.dumps(ack(task))
    fsm.receive(answer, answer)  # twice in one batch
    fsm.receive(answer)  # and again later
    go = threading.Barrier(2)

    def again() -> None:
        go.wait()
        fsm.receive(answer)

    threads = [threading.Thread(target=again) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert [h.to_state for h in fsm.history(mid)] == ["ONE", "TWO"]
    assert fsm.rejections(mid) == ["stale_attempt"] * 4
    assert [t["state"] for t in agent.tasks()] == ["TWO"]  # dispatched once


def test_an_attempt_past_its_deadline_times_out_is_retried_then_takes_its_failure_edge(
    fsm: Fsm,
) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_timeout", {"who": "the oracle"})
    assert agent.task()["prompt"] == "Wait for the oracle."
    fsm.clock.advance(0.9)
    assert fsm.scan() == [] and agent.tasks() == []  # not yet
    fsm.clock.advance(0.2)
    fsm.scan()
    retry = agent.task()
    assert (retry["state"], retry["attempt"]) == ("WAIT", 2)
    fsm.clock.advance(1.1)
    fsm.scan()
    assert agent.task()["state"] == "FALLBACK"
    history = fsm.history(mid)
    events = [(h.event, h.to_state, h.success) for h in history]
    assert events == [
        ("start", "WAIT", True),
        ("timeout", "WAIT", False),
        ("timeout", "FALLBACK", False),
    ]
    assert (history[1].error_message, history[1].duration_ms) == ("timed out (retry 1 of 1)", 1100)
    assert fsm.receive(ack(retry)) == [] and fsm.rejections(mid) == ["stale_attempt"]
    assert fsm.receive(ack(agent.seen[-1])) == []  # FALLBACK's
    assert fsm.machine(mid).status == "completed"


def test_a_retry_waits_out_its_backoff_before_it_is_entered(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_backoff")
    [retry] = fsm.receive(ack(agent.task(), success=False, error="flaky"))
    assert (retry.machine_id, retry.attempt, retry.delay) == (mid, 2, 1.0)
    fsm.enter_all([retry])  # its countdown fired early: nothing is sent
    assert agent.tasks() == []
    fsm.clock.advance(1.0)
    fsm.enter_all([retry])
    assert [(t["state"], t["attempt"]) for t in agent.tasks()] == [("SLOW_RETRY", 2)]
    fsm.enter_all([retry])  # a redelivered enter_state task: still one dispatch
    assert agent.tasks() == []
    [again] = fsm.receive(ack(agent.seen[-1], success=False))
    assert (again.attempt, again.delay) == (3, 2.0)  # 1 s times the rate, 2


def test_the_scan_enters_a_state_whose_enter_task_was_lost(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    [first] = fsm.engine.admin.start("test_linear").next  # and its enter_state task never ran
    assert fsm.scan() == [] and agent.tasks() == []  # within the grace: a task is on its way
    fsm.clock.advance(fsm.settings.dispatch_grace_seconds + 0.1)
    assert fsm.scan() == []
    task = agent.task()
    assert (task["machineId"], task["attempt"]) == (str(first.machine_id), 1)
    assert fsm.engine.entry.enter(first.machine_id, 1) == [] and agent.tasks() == []


def test_heartbeats_hold_off_the_timeout(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_heartbeat")
    task = agent.task()
    fsm.clock.advance(1.0)
    fsm.receive(heartbeat_for(task, progress="half way"))
    fsm.clock.advance(1.2)  # past the state's own two seconds, within the heartbeat's 1.5
    fsm.scan()
    machine = fsm.machine(mid)
    assert (machine.status, machine.attempt, machine.progress) == ("running", 1, "half way")
    fsm.clock.advance(0.4)
    fsm.scan()
    assert [(h.event, h.to_state) for h in fsm.history(mid)] == [
        ("start", "LONG"),
        ("timeout", "FAILED"),
    ]
    assert fsm.history(mid)[-1].progress == "half way"


def test_progress_shows_while_an_attempt_works_and_is_cleared_when_it_ends(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_heartbeat")
    task = agent.task()
    fsm.receive(heartbeat_for(task, progress="2.0s to go"))
    working = fsm.machine(mid)
    assert (working.progress, working.heartbeat_at) == ("2.0s to go", fsm.clock.now)
    fsm.clock.advance(0.5)
    fsm.receive(ack(task))
    done = fsm.machine(mid)
    assert (done.status, done.progress, done.heartbeat_at) == ("completed", None, None)
    assert fsm.history(mid)[-1].progress == "2.0s to go"


def test_bad_messages_are_recorded_and_the_good_one_beside_them_is_applied(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_linear")
    task = agent.task()
    forged = {**ack(task), "taskToken": "0" * 64}
    gone = uuid.uuid4()  # a machine with a valid token that does not exist
    token = task_token(TEST_SECRET, gone, task["state"], task["attempt"])
    bad = [
        "{not json",
        json.dumps({**ack(task), "output": {"one": "x" * 2_000_000}}),
        json.dumps({**ack(task), "machineId": str(gone), "taskToken": token}),
        json.dumps(forged),
        json.dumps({**ack(task), "output": {"one": "nul \x00 here"}}),
        json.dumps({**ack(task), "output": {"other": 1}}),
    ]
    fsm.receive(*bad[:-1], ack(task) | {"attempt": 99})
    assert fsm.machine(mid).attempt == 1  # nothing moved it
    fsm.receive(bad[-1], ack(task))
    # the answer breaking its contract goes back to be corrected; the good one beside it counts
    assert [(h.event, h.to_state) for h in fsm.history(mid)] == [
        ("start", "ONE"),
        ("refused", "ONE"),
        ("ack", "TWO"),
    ]
    reasons = fsm.rejections()  # those found before the transaction come first
    assert sorted(reasons[:6]) == sorted(
        [
            "malformed_json",
            "oversized",
            "unknown_machine",
            "bad_token",
            "invalid_value",
            "bad_token",  # attempt 99: its token is attempt 1's
        ]
    )
    assert reasons[6:] == []


def test_an_ack_from_another_agents_stream_is_refused(fsm: Fsm) -> None:
    owner, other = uuid.uuid4(), uuid.uuid4()
    mid = fsm.start("test_linear", agent_id=owner)
    task = fsm.agent(str(owner)).task()
    fsm.receive(ack(task), agent=other)
    assert fsm.rejections(mid) == ["wrong_agent"] and fsm.machine(mid).attempt == 1
    fsm.receive(ack(task), agent=owner)
    assert fsm.machine(mid).current_state == "TWO"


def test_a_machine_whose_first_state_names_its_agent_type_starts_as_one_of_that_type(
    fsm: Fsm,
) -> None:
    work = {"on_success": "DONE", "on_failure": "FAILED"}
    typed = {
        "type": "typed_start",
        "agent_type": "tester",
        "initial_state": "PLAN",
        "states": [
            {"name": "PLAN", "agent_type": "planner", **work},
            {"name": "DONE", "terminal": "completed"},
            {"name": "FAILED", "terminal": "failed"},
        ],
    }
    fsm.engine.catalog.load([parse_definition(typed)])
    planner = uuid.uuid4()
    with fsm.engine.db.begin() as conn:
        agent_store.register_agent_txn(conn, planner, "planner", fsm.clock())
    mid = fsm.start("typed_start")
    assert fsm.machine(mid).agent_type == "planner"
    fsm.receive(ack(fsm.agent("planner").task()), agent=planner)  # not wrong_agent
    assert fsm.machine(mid).status == "completed"


def test_commands_pause_resume_force_and_cancel_a_machine(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_linear")
    in_flight = agent.task()
    admin = fsm.engine.admin
    assert admin.command(mid, Command(Action.PAUSE, "ops", "look first")) == []
    fsm.receive(ack(in_flight))
    assert fsm.rejections(mid) == ["stale_attempt"]  # pausing closed the attempt
    with pytest.raises(CommandRefused):
        admin.command(mid, Command(Action.PAUSE, "ops", "again"))
    assert fsm.machine(mid).status == "paused"  # a refused command changed nothing
    admin.command(mid, Command(Action.RESUME, "ops", "go on"))
    assert [(t["state"], t["attempt"]) for t in agent.tasks()] == [("ONE", 3)]
    admin.command(mid, Command(Action.FORCE, "ops", "skip ahead", "THREE"))
    assert [(t["state"], t["attempt"]) for t in agent.tasks()] == [("THREE", 4)]
    admin.command(mid, Command(Action.CANCEL, "ops", "enough"))
    assert fsm.machine(mid).status == "cancelled" and agent.tasks() == []
    audit = [(h.event, h.actor, h.reason) for h in fsm.history(mid)[1:]]
    assert audit == [
        ("pause", "ops", "look first"),
        ("resume", "ops", "go on"),
        ("force", "ops", "skip ahead"),
        ("cancel", "ops", "enough"),
    ]


def test_a_state_whose_prompt_cannot_render_fails_its_machine_without_a_task(fsm: Fsm) -> None:
    agent = fsm.agent("tester")
    mid = fsm.start("test_poison", {"divisor": 0, "width": 1})  # 100 / 0 in FIRST's prompt
    ok = fsm.start("test_poison", {"divisor": 4, "width": 1})
    assert [t["machineId"] for t in agent.tasks()] == [str(ok)]
    history = fsm.history(mid)
    assert [(h.event, h.to_state) for h in history] == [
        ("start", "FIRST"),
        ("dispatch_error", "FIRST"),  # failed where it is, its failure edge not taken
    ]
    assert "ZeroDivisionError" in (history[-1].error_message or "")
    assert fsm.machine(mid).status == "failed"


def test_without_entering_every_decided_state_is_handed_on_and_nothing_is_sent(fsm: Fsm) -> None:
    """The celery mode: fsm.apply_acks applies, and an enter_state task per step sends."""
    agent = fsm.agent("tester")
    mids = [fsm.start("test_linear") for _ in range(3)]
    answers = [json.dumps(ack(task)) for task in agent.tasks()]
    next_states = fsm.engine.inbox.apply([Inbound(a) for a in answers])
    assert sorted(s.machine_id for s in next_states) == sorted(mids)
    assert {(s.state, s.attempt, s.delay) for s in next_states} == {("TWO", 2, 0.0)}
    assert agent.tasks() == []
    fsm.enter_all(next_states)
    assert sorted(t["machineId"] for t in agent.tasks()) == sorted(map(str, mids))


def test_batches_reporting_the_same_agents_in_opposite_orders_never_deadlock(fsm: Fsm) -> None:
    """Two bridge processes each read the same agents' statuses, in whatever order they came
    (round robin over the agents' streams): the agents' rows are written in one order, by id,
    as the machines' are locked."""
    agents = [str(uuid.uuid4()) for _ in range(20)]

    def status(agent: str) -> Inbound:
        report = {"type": "agent_status", "agentId": agent, "agentType": "tester"}
        return Inbound(json.dumps({**report, "status": "active", "concurrency": 4}))

    failures: list[Exception] = []
    go = threading.Barrier(2)

    def batches(order: list[str]) -> None:
        for _ in range(200):
            batch = [status(agent) for agent in order]
            go.wait()
            try:
                fsm.inline.apply(batch)
            except Exception as exc:
                failures.append(exc)

    threads = [threading.Thread(target=batches, args=(o,)) for o in (agents, agents[::-1])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, f"{len(failures)} batches failed: {str(failures[0]).splitlines()[0]}"
