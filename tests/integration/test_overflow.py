"""Acceptance: what would overflow a column is refused before anything is sent, and nothing
stops on it. A hostile agent's usage that would take its machine's totals past what they hold,
in one batch with honest agents' acks through the real bridge; statistics over rows stored with
such values before the bounds existed; a machine entered 30 days ago, under the real scan and
the real CLI (issue 23: 13, 14, 15)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from datetime import datetime
from typing import Any

import pytest
from sqlalchemy import insert, select, text

from fsm_celery.core.messages import agent_ack_stream
from fsm_celery.core.stats import MOST, MOST_COST
from fsm_celery.store import tables
from tests.integration.conftest import ONE_MODE
from tests.support.agents import ScriptedAgent
from tests.support.credentials import ADMIN_TOKEN
from tests.support.messages import SILENT, ack_for, dispatches
from tests.support.processes import FsmEnv

HONEST = 3  # agents, each with two machines whose acks share the hostile ack's batch
DAY_MS = 86_400_000


@pytest.fixture(scope="module")
def overflow(env_factory: Callable[..., FsmEnv], mode: str) -> Iterator[FsmEnv]:
    env = env_factory(f"overflow_{mode}", transition_mode=mode)
    env.start_worker()
    env.start_bridge()
    yield env
    env.stop_all()


def _steps(env: FsmEnv, machine_id: uuid.UUID) -> str:
    """The machine as it stands and its history (what a failure says of it)."""
    machine = env.client.get_machine(machine_id)
    steps = [
        (h.event, h.to_state, h.attempt, h.error_message) for h in env.client.history(machine_id)
    ]
    return f"(attempt {machine.attempt}, deadline {machine.deadline_at}; history {steps})"


def _status(agent: ScriptedAgent) -> str:
    return json.dumps(
        {
            "type": "agent_status",
            "agentId": agent.id,
            "agentType": "tester",
            "status": "active",
            "concurrency": 4,
        }
    )


def _report(task: dict[str, Any], field: str, value: Any) -> str:
    return json.dumps({**ack_for(task), "output": {"first": 1, "second": 2, field: value}})


def _together(env: FsmEnv, messages: list[tuple[str, str]]) -> None:
    """XADD each (agent, message) to the agent's own ack stream in one MULTI, so that the
    bridge reads them all in its next batch."""
    pipe = env.redis.pipeline(transaction=True)
    for agent, message in messages:
        pipe.xadd(agent_ack_stream(agent, env.settings.channel_prefix), {"message": message})
    pipe.execute()


def _wait(
    condition: Callable[[], bool],
    what: str,
    said: Callable[[], str] = lambda: "",
    timeout: float = 120.0,
) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout}s {said()}")
        time.sleep(0.05)


def _assert_sent_once(env: FsmEnv, *agents: str) -> None:
    for agent in agents:
        twice = {key: n for key, n in dispatches(env, agent).items() if n > 1}
        assert twice == {}, f"state_tasks sent more than once: {twice}"


def _active(env: FsmEnv) -> set[str]:
    return {a["id"] for a in env.client.agents() if a["status"] == "active"}


class _Honest:
    """Agents whose machines wait, each with its first state_task unanswered."""

    def __init__(self, env: FsmEnv) -> None:
        self.env = env
        self.agents = [
            ScriptedAgent(env, {"FIRST": [SILENT] * 2}, own_stream=True) for _ in range(HONEST)
        ]
        self.machines: list[uuid.UUID] = []

    def __enter__(self) -> _Honest:
        for agent in self.agents:
            agent.__enter__()
        try:
            for agent in self.agents:
                agent.send(_status(agent))  # the bridge knows its stream before the batch
                for _ in range(2):
                    self.machines.append(
                        self.env.client.start_machine("test_pair", {}, agent_id=agent.id)
                    )
            for agent in self.agents:
                agent.wait_for_tasks(2)
            ids = {a.id for a in self.agents}
            _wait(lambda: ids <= _active(self.env), "the honest agents' statuses were applied")
        except BaseException:
            self.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for agent in self.agents:
            agent.__exit__(*exc)

    def acks(self) -> list[tuple[str, str]]:
        return [(a.id, json.dumps(ack_for(task))) for a in self.agents for task in a.tasks]

    def finish(self) -> None:
        for mid in self.machines:
            assert self.env.wait_until_done(mid, timeout=60).status == "completed"
        _assert_sent_once(self.env, *(a.id for a in self.agents))


@pytest.mark.parametrize(
    ("field", "value"),
    [("cost", 1.7e308), ("tokensUsed", 2**63 - 1), ("cost", 1e12), ("tokensUsed", 2**53 - 1)],
    ids=["cost-1.7e308", "tokens-2**63-1", "cost-1e12", "tokens-2**53-1"],
)
def test_usage_past_a_machines_totals_is_refused_and_honest_agents_get_each_task_once(
    overflow: FsmEnv, field: str, value: Any
) -> None:
    script = {"FIRST": [SILENT] * 3, "SECOND": [SILENT] * 3}
    with ScriptedAgent(overflow, script, own_stream=True) as hostile, _Honest(overflow) as honest:
        mid = overflow.client.start_machine("test_pair", {}, agent_id=hostile.id)
        first = hostile.wait_for_tasks(1)
        hostile.send(_report(first, field, value))  # alone: within the bounds, or not
        _wait(
            lambda: len(hostile.tasks) > 1 or bool(overflow.client.rejected(mid)),
            "the first report was neither applied nor rejected",
        )
        latest = hostile.tasks[-1]
        # the same again, in one batch with the honest agents' acks: past the bounds now
        _together(overflow, [(hostile.id, _report(latest, field, value)), *honest.acks()])
        honest.finish()
        refused = overflow.wait_for_rejections(mid, 1)
        assert refused and {r["reason"] for r in refused} == {"invalid_value"}, refused
        assert "would take the machine's totals to" in refused[-1]["detail"]
        machine = overflow.client.get_machine(mid)
        assert (machine.status, machine.attempt) == ("running", latest["attempt"])
        assert machine.tokens_used <= 2**53 - 1 and machine.cost <= 1e12
        _assert_sent_once(overflow, hostile.id)


def test_a_write_refused_after_the_batch_sent_its_tasks_sends_none_of_them_twice(
    overflow: FsmEnv,
) -> None:
    """What nothing can check beforehand (here a trigger refuses the hostile machine's history
    row): the batch is split and tried again, and the state_tasks its failed try sent are
    recorded without being sent again."""
    script = {"FIRST": [SILENT], "SECOND": [SILENT]}  # what the failed try sent, unanswered
    with ScriptedAgent(overflow, script, own_stream=True) as hostile, _Honest(overflow) as honest:
        hostile.send(_status(hostile))  # its stream is read in the same batch
        _wait(lambda: hostile.id in _active(overflow), "the hostile agent's status was applied")
        mid = overflow.client.start_machine("test_pair", {}, agent_id=hostile.id)
        first = hostile.wait_for_tasks(1)
        with _refusing_history_of(overflow, mid):
            _together(overflow, [(hostile.id, json.dumps(ack_for(first))), *honest.acks()])
            honest.finish()
            refused = overflow.wait_for_rejections(mid, 1)
        assert [r["reason"] for r in refused] == ["unprocessable"], refused
        assert overflow.client.get_machine(mid).attempt == 1
        _assert_sent_once(overflow, hostile.id)


class _refusing_history_of:
    def __init__(self, env: FsmEnv, machine_id: uuid.UUID) -> None:
        self.env, self.machine_id = env, machine_id
        self.name = f"refuse_{machine_id.hex}"

    def __enter__(self) -> None:
        with self.env.client.engine.db.begin() as conn:
            conn.exec_driver_sql(
                f"CREATE FUNCTION {self.name}() RETURNS trigger AS $$ BEGIN "
                f"IF NEW.machine_id = '{self.machine_id}' AND NEW.event = 'ack' THEN "
                "RAISE EXCEPTION 'refused'; END IF; RETURN NEW; END $$ LANGUAGE plpgsql"
            )
            conn.exec_driver_sql(
                f"CREATE TRIGGER {self.name} BEFORE INSERT ON state_transitions "
                f"FOR EACH ROW EXECUTE FUNCTION {self.name}()"
            )

    def __exit__(self, *_: object) -> None:
        with self.env.client.engine.db.begin() as conn:
            conn.exec_driver_sql(f"DROP TRIGGER {self.name} ON state_transitions")
            conn.exec_driver_sql(f"DROP FUNCTION {self.name}()")


# -- statistics over rows stored before the bounds -------------------------------------------


@pytest.fixture(scope="module")
def stored(env_factory: Callable[..., FsmEnv]) -> FsmEnv:
    return env_factory("overflow_stats")


def test_statistics_fold_and_read_past_rows_stored_with_huge_values(stored: FsmEnv) -> None:
    agent = uuid.uuid4()
    machines = [stored.client.start_machine("test_pair", {}) for _ in range(2)]
    with stored.client.engine.db.begin() as conn:
        for mid in machines:  # as a database written before the bounds may hold them
            conn.execute(
                text("UPDATE state_machines SET tokens_used = :t, cost = :c WHERE id = :id"),
                {"t": 2**63 - 1, "c": 1.7e308, "id": mid},
            )
        created = conn.execute(
            select(tables.machines.c.id, tables.machines.c.created_at).where(
                tables.machines.c.id.in_(machines)
            )
        )
        rows = [_huge_attempt(row.id, row.created_at, agent) for row in created]
        conn.execute(insert(tables.transitions), rows)
    before = _api_stats(stored)  # the attempts not folded yet
    fold = stored.client.engine.stats.fold
    fold()  # notes how far it may fold
    time.sleep(1.1)
    assert fold() == 2  # and folds past them
    assert fold() == 0
    after = _api_stats(stored)
    for stats in (before, after):
        assert stats["usage"]["by_agent"][str(agent)] == {
            "tokens": MOST,
            "cost": MOST_COST,
            "attempts": 2,
        }
        assert stats["usage"]["by_type"]["test_pair"]["tokens"] == MOST
        assert stats["usage"]["by_type"]["test_pair"]["cost"] < float("inf")
        assert stats["states"]["test_pair"]["FIRST"]["attempts"] == 2
    assert after["as_of"]["unfolded"] == 0
    shown = subprocess.run(
        [sys.executable, "-m", "fsm_celery", "stats"],
        env=stored.env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert shown.returncode == 0, shown.stderr


def _huge_attempt(machine_id: uuid.UUID, created: datetime, agent: uuid.UUID) -> dict[str, Any]:
    return {
        "machine_id": machine_id,
        "machine_created_at": created,
        "from_state": "FIRST",
        "to_state": "SECOND",
        "success": True,
        "attempt": 1,
        "event": "ack",
        "duration_ms": 2**62,  # twice that is past BIGINT
        "agent_id": agent,
        "tokens_used": 2**63 - 1,
        "cost": 1.7e308,
    }


def _api_stats(env: FsmEnv) -> dict[str, Any]:
    with env.api() as api:
        answer = api.get("/api/stats", headers={"Authorization": f"Bearer {ADMIN_TOKEN}"})
    assert answer.status_code == 200, answer.text
    stats: dict[str, Any] = answer.json()
    return stats


# -- a machine entered 30 days ago -----------------------------------------------------------


def _age(env: FsmEnv, machine_id: uuid.UUID) -> None:
    """Make the machine's current state entered 31 days ago."""
    with env.client.engine.db.begin() as conn:
        conn.execute(
            text(
                "UPDATE state_machines SET entered_at = now() - interval '31 days' WHERE id = :id"
            ),
            {"id": machine_id},
        )


def _cli(env: FsmEnv, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsm_celery", *args],
        env=env.env,
        capture_output=True,
        text=True,
        timeout=60,
    )


@ONE_MODE
def test_a_machine_entered_30_days_ago_times_out_with_the_others_in_the_same_scan(
    overflow: FsmEnv,
) -> None:
    # silent to both attempts of both machines: an answer to a second attempt would move its
    # machine on past it (the script's replies are the agent's, not a machine's)
    with ScriptedAgent(overflow, {"FIRST": [SILENT] * 4}, own_stream=True) as agent:
        old, other = (
            overflow.client.start_machine("test_pair", {}, agent_id=agent.id) for _ in range(2)
        )
        agent.wait_for_tasks(2)
        with overflow.client.engine.db.begin() as conn:  # the next scan finds both overdue
            conn.execute(
                text(
                    "UPDATE state_machines SET deadline_at = now() - interval '1 second', "
                    "entered_at = CASE WHEN id = :old THEN now() - interval '31 days' "
                    "ELSE entered_at END WHERE id IN (:old, :other)"
                ),
                {"old": old, "other": other},
            )
        for mid in (old, other):
            _wait(
                lambda m=mid: overflow.client.get_machine(m).attempt >= 2,
                f"{mid} timed out",
                lambda m=mid: _steps(overflow, m),
            )
        timeout = overflow.client.history(old)[-1]
        assert (timeout.event, timeout.error_message) == ("timeout", "timed out (retry 1 of 3)")
        assert timeout.duration_ms is not None and timeout.duration_ms >= 31 * DAY_MS
        _assert_sent_once(overflow, agent.id)


@ONE_MODE
def test_commands_on_a_machine_entered_30_days_ago_succeed(overflow: FsmEnv) -> None:
    script = {"FIRST": [SILENT], "SECOND": [SILENT] * 3}
    with ScriptedAgent(overflow, script, own_stream=True) as a:
        mid = overflow.client.start_machine("test_pair", {}, agent_id=a.id)
        a.wait_for_tasks(1)
        for command in (["pause"], ["force", "SECOND"], ["cancel"], ["retry"]):
            _age(overflow, mid)
            done = _cli(overflow, command[0], str(mid), *command[1:], "--reason", "old")
            assert done.returncode == 0, (command, done.stdout, done.stderr)
        events = [(h.event, h.duration_ms) for h in overflow.client.history(mid)[1:]]
        assert [e for e, _ in events] == ["pause", "force", "cancel", "retry"]
        # a running state is timed (pause, cancel); a move out of a stopped one is not
        timed = {"pause": True, "force": False, "cancel": True, "retry": False}
        for event, ms in events:
            assert (ms is not None and ms >= 31 * DAY_MS) if timed[event] else ms is None, events
