"""Schedules under real `celery beat` processes: two beats, one machine per tick; overlap skip."""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest
import yaml
from sqlalchemy import select

from fsm_celery.core.loader import SHIPPED_DEFINITIONS, parse_definition
from fsm_celery.store.tables import machines, schedule_runs, transitions
from tests.support.processes import FsmEnv

EVERY_SECOND = "* * * * * *"


def _runs(env: FsmEnv) -> list[Any]:
    with env.client.engine.db.connect() as conn:
        return list(conn.execute(select(schedule_runs).order_by(schedule_runs.c.tick_at)).all())


def _machines(env: FsmEnv, machine_type: str) -> list[Any]:
    with env.client.engine.db.connect() as conn:
        return list(
            conn.execute(
                select(machines)
                .where(machines.c.type == machine_type)
                .order_by(machines.c.created_at)
            ).all()
        )


def _wait_for_runs(env: FsmEnv, count: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while len(_runs(env)) < count:
        assert time.monotonic() < deadline, f"{len(_runs(env))} of {count} ticks ran"
        time.sleep(0.2)


def test_two_beats_start_exactly_one_machine_per_tick(
    env_factory: Callable[..., FsmEnv], request: pytest.FixtureRequest
) -> None:
    env = env_factory("two_beats", schedule_interval_seconds=0.2)
    request.addfinalizer(env.stop_all)  # its beats tick five times a second: not for later tests
    env.client.engine.catalog.load(
        [
            parse_definition(
                {
                    "type": "every_second",
                    "agent_type": "nobody",  # no agent: the machines wait in their first state
                    "initial_state": "WAIT",
                    "schedules": [{"cron": EVERY_SECOND, "overlap": "allow"}],
                    "states": [
                        {"name": "WAIT", "on_success": "DONE", "on_failure": "DONE"},
                        {"name": "DONE", "terminal": "completed"},
                    ],
                }
            )
        ]
    )
    env.start_worker(beat=False)
    env.start_beat()
    env.start_beat()
    _wait_for_runs(env, 10)
    env.client.pause_schedule("every_second", "test", "ten ticks seen")
    time.sleep(1.0)  # a tick a beat was handling as the pause committed has settled

    runs = _runs(env)
    started = _machines(env, "every_second")
    ticks = [r.tick_at for r in runs]
    assert len(runs) >= 10 and {r.outcome for r in runs} == {"started"}
    assert len(started) == len(runs)  # exactly one machine per tick, with two beats sending
    assert sorted(r.machine_id for r in runs) == sorted(m.id for m in started)
    assert ticks[:10] == [ticks[0] + timedelta(seconds=i) for i in range(10)]  # none missed


def test_skip_starts_no_machine_while_the_previous_one_runs(
    env_factory: Callable[..., FsmEnv], request: pytest.FixtureRequest
) -> None:
    env = env_factory("overlap_skip", schedule_interval_seconds=0.2)
    request.addfinalizer(env.stop_all)
    body = yaml.safe_load((SHIPPED_DEFINITIONS / "cto_infrastructure_check.yaml").read_text())
    body["schedules"] = [{"name": "every-second", "cron": EVERY_SECOND}]  # overlap: skip
    env.client.engine.catalog.load([parse_definition(body)])
    env.start_worker(beat=False)
    env.start_bridge()
    env.start_agent("--mock", "--agent-type", "cto", "--slow", "CHECK_UPTIME=2.5")
    env.wait_for_agents(1)
    env.start_beat()
    env.start_beat()
    deadline = time.monotonic() + 90
    while len([m for m in _machines(env, body["type"]) if m.status == "completed"]) < 3:
        assert time.monotonic() < deadline, "three rounds did not complete in 90 s"
        time.sleep(0.3)
    env.client.pause_schedule(body["type"], "test", "three rounds seen")
    time.sleep(1.0)

    rounds = _machines(env, body["type"])
    runs = _runs(env)
    assert len([r for r in runs if r.outcome == "started"]) == len(rounds)
    assert len([r for r in runs if r.outcome == "skipped"]) >= 3  # 2.5 s rounds, 1 s ticks
    ended = _ended_at(env, [m.id for m in rounds])
    for earlier, later in itertools.pairwise(rounds):
        # a tick's time is read before its transaction sees the previous round finished
        assert later.created_at + timedelta(seconds=0.5) >= ended[earlier.id], (
            "a round started while the previous one ran"
        )


def _ended_at(env: FsmEnv, ids: list[Any]) -> dict[Any, Any]:
    """When each machine reached its terminal state (its last transition)."""
    with env.client.engine.db.connect() as conn:
        rows = conn.execute(
            select(transitions.c.machine_id, transitions.c.created_at).where(
                transitions.c.machine_id.in_(ids)
            )
        ).all()
    ended: dict[Any, Any] = {}
    for mid, at in rows:
        ended[mid] = max(ended.get(mid, at), at)
    return ended
