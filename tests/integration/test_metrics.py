"""Every long-running process serves Prometheus metrics, and they move as machines run: a real
worker (a threads pool, and a prefork pool through multiprocess mode), beat, the ack bridge
(two processes, its values added up), an SDK agent, and the dashboard's fleet-wide gauges
behind a token. Counters and gauges are asserted present and moved, never a rate or a time.
"""

from __future__ import annotations

import dataclasses
import sys
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import httpx
import pytest

from fsm_celery.core.messages import ack_stream
from tests.support.credentials import ADMIN_TOKEN, VIEWER_TOKEN
from tests.support.processes import LOGS, FsmEnv
from tests.support.scrape import Samples, free_port, names, scrape, total, wait_for

SCRIPT = "tests/integration/sdk_agent.py"
METRICS_TOKEN = "prometheus-scrape-token-" + "5e6f7a8b9c0d1e2f" * 2
VIEWER = {"Authorization": f"Bearer {VIEWER_TOKEN}"}
NOBODY = str(uuid.UUID(int=7))  # an agent id nobody serves: its machines time out


def on_port(env: FsmEnv, port: int, **settings: Any) -> FsmEnv:
    """The deployment as a process that serves /metrics on the port sees it (FSM_METRICS_PORT)."""
    changed = env.settings.model_copy(update={"metrics_port": port, **settings})
    return dataclasses.replace(env, settings=changed)


def url(port: int) -> str:
    return f"http://127.0.0.1:{port}/metrics"


def start_beat(env: FsmEnv) -> None:
    schedule = LOGS / f"{env.name}-beat-{uuid.uuid4().hex[:6]}"
    argv = [sys.executable, "-m", "celery", "-A", "fsm_celery", "beat", "-s", str(schedule)]
    env._spawn("beat", [*argv, "-l", "info"]).wait_for_log("beat: Starting...")


def run_machines(env: FsmEnv, agent_id: str) -> tuple[list[uuid.UUID], uuid.UUID]:
    """Three linear machines its agent completes, and one whose agent never answers (its
    attempt times out, is retried, times out again)."""
    done = [env.client.start_machine("test_linear", {}, agent_id=agent_id) for _ in range(3)]
    stuck = env.client.start_machine("test_timeout", {"who": "nobody"}, agent_id=NOBODY)
    for machine_id in done:
        assert env.wait_until_done(machine_id).status == "completed"
    return done, stuck


# ---- the celery mode: a threads worker, beat, a bridge of two processes, an agent ----------


@pytest.fixture(scope="module")
def ports() -> dict[str, int]:
    return {name: free_port() for name in ("worker", "beat", "bridge", "agent")}


@pytest.fixture(scope="module")
def celery_env(env_factory: Callable[..., FsmEnv], ports: dict[str, int]) -> Iterator[FsmEnv]:
    env = env_factory("metrics")
    on_port(env, ports["worker"]).start_worker(beat=False)
    start_beat(on_port(env, ports["beat"]))
    on_port(env, ports["bridge"]).start_bridge(2)
    agent_id = str(uuid.uuid4())
    on_port(env, ports["agent"]).start_agent(SCRIPT, "tester", agent_id)
    env.wait_for_agents(1)
    run_machines(env, agent_id)
    env.redis.xadd(ack_stream(env.settings.channel_prefix), {"message": "{not json"})
    yield env
    env.stop_all()


def test_a_threads_worker_counts_transitions_retries_timeouts_and_scans(
    celery_env: FsmEnv, ports: dict[str, int]
) -> None:
    def moved(s: Samples) -> bool:
        return (
            total(s, "fsm_transitions_total", mode="celery", outcome="succeeded") >= 9
            and total(s, "fsm_timeouts_total", machine_type="test_timeout", state="WAIT") >= 1
            and total(s, "fsm_rejected_messages_total", reason="malformed_json") >= 1
        )

    samples = wait_for(url(ports["worker"]), moved)
    assert total(samples, "fsm_transitions_total", machine_type="test_linear") >= 9
    assert total(samples, "fsm_transitions_total", outcome="timed_out") >= 1
    assert total(samples, "fsm_retries_total", machine_type="test_timeout") >= 1
    assert total(samples, "fsm_attempt_duration_seconds_count", state="ONE") >= 3
    assert total(samples, "fsm_ack_to_task_seconds_count", mode="celery") >= 6
    assert total(samples, "fsm_scan_duration_seconds_count") >= 1
    assert total(samples, "fsm_scan_last_run_timestamp_seconds") > 0
    assert {"fsm_unprocessable_total", "fsm_dead_letters_total"} <= names(samples)


def test_beat_counts_the_periodic_tasks_it_sends(ports: dict[str, int], celery_env: FsmEnv) -> None:
    samples = wait_for(
        url(ports["beat"]), lambda s: total(s, "fsm_beat_sends_total", task="fsm.scan") >= 2
    )
    assert total(samples, "fsm_beat_sends_total", task="fsm.run_schedules") >= 1


def test_the_bridge_adds_up_what_its_processes_read(
    ports: dict[str, int], celery_env: FsmEnv
) -> None:
    samples = wait_for(
        url(ports["bridge"]),
        lambda s: total(s, "fsm_bridge_messages_total", outcome="finished") >= 9,
    )
    assert total(samples, "fsm_redis_reconnects_total", role="bridge") == 0
    assert total(samples, "fsm_dead_letters_total") == 0


def test_an_sdk_agent_counts_the_tasks_it_answered(
    ports: dict[str, int], celery_env: FsmEnv
) -> None:
    samples = scrape(url(ports["agent"]))
    assert total(samples, "fsm_agent_tasks_total", agent_type="tester", outcome="succeeded") >= 9
    assert ("fsm_agent_running", frozenset({("agent_type", "tester")})) in samples
    assert total(samples, "fsm_redis_reconnects_total", role="agent") == 0


@pytest.fixture(scope="module")
def dashboard(celery_env: FsmEnv) -> str:
    """The dashboard's /metrics, once machines wait: at an approval gate, at a fan-out whose
    children's agent types have no agent, and one with an outside event kept for it (sent
    through the dashboard's own API)."""
    env = celery_env
    _, base = on_port(env, 0, metrics_token=METRICS_TOKEN).start_dashboard()
    agent_id = env.wait_for_agents(1)[0]["id"]
    gated = env.client.start_machine("test_gate", {}, agent_id=agent_id)
    env.wait_for_gate(gated, "REVIEW")
    fanned = env.client.start_machine("test_fan_parallel", {"repo": "metrics"})
    env.wait_for_state(fanned, "BUILD")
    waiting = env.client.start_machine("test_wait", {}, agent_id=NOBODY)
    sent = httpx.post(
        f"{base}/api/machines/{waiting}/events/pr_merged",
        json={"payload": {"merged": True}},
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        timeout=10,
    )
    assert sent.status_code == 200, sent.text
    return f"{base}/metrics"


def test_the_dashboard_serves_the_fleets_gauges_to_a_viewer(
    dashboard: str, celery_env: FsmEnv
) -> None:
    samples = wait_for(
        dashboard,
        lambda s: total(s, "fsm_machines", machine_type="test_linear", status="completed") >= 3,
        headers=VIEWER,
    )
    assert total(samples, "fsm_agents_live", agent_type="tester") >= 1
    assert total(samples, "fsm_build_info") == 1
    assert total(samples, "fsm_scan_last_seen_timestamp_seconds") > 0
    assert total(samples, "fsm_history_partitions") >= 1
    assert total(samples, "fsm_scrape_errors") == 0
    queue = celery_env.settings.queue
    assert ("fsm_celery_queue_length", frozenset({("queue", queue)})) in samples
    assert total(samples, "fsm_approvals_waiting", machine_type="test_gate") >= 1
    assert total(samples, "fsm_events_total", outcome="kept") >= 1
    assert total(samples, "fsm_events_kept") >= 1
    expected = {
        "fsm_approvals_past_sla",
        "fsm_machines_overdue",
        "fsm_oldest_overdue_seconds",
        "fsm_acks_pending",
        "fsm_acks_oldest_pending_seconds",
        "fsm_dead_letters",
        "fsm_work_waiting",
        "fsm_events_kept",
        "fsm_usage_tokens_total",
        "fsm_usage_cost_total",
    }
    assert sorted(expected - names(samples)) == []


def test_the_dashboard_shows_work_waiting_for_a_type_without_agents(
    dashboard: str, celery_env: FsmEnv
) -> None:
    samples = wait_for(
        dashboard,
        lambda s: (
            total(s, "fsm_fanouts_open", machine_type="test_fan_parallel") >= 1
            and total(s, "fsm_work_waiting", agent_type="writer") >= 1
        ),
        headers=VIEWER,
    )
    assert total(samples, "fsm_agents_live", agent_type="writer") == 0  # an alert's very case


def test_the_dashboards_metrics_need_a_token(dashboard: str) -> None:
    assert httpx.get(dashboard, timeout=10).status_code == 401
    wrong = {"Authorization": "Bearer not-a-token"}
    assert httpx.get(dashboard, headers=wrong, timeout=10).status_code == 401
    dedicated = {"Authorization": f"Bearer {METRICS_TOKEN}"}
    assert "fsm_machines" in names(scrape(dashboard, dedicated))


# ---- the inline mode: a prefork worker, an inline bridge of two processes -----------------


def test_a_prefork_worker_and_an_inline_bridge_add_up_their_processes(
    env_factory: Callable[..., FsmEnv],
) -> None:
    env = env_factory("metrics_inline", transition_mode="inline")
    worker, bridge, agent = free_port(), free_port(), free_port()
    on_port(env, worker).start_worker(pool="prefork", concurrency=2)
    on_port(env, bridge).start_bridge(2, "--inline")
    agent_id = str(uuid.uuid4())
    on_port(env, agent).start_agent(SCRIPT, "tester", agent_id)
    env.wait_for_agents(1)
    run_machines(env, agent_id)
    applied = wait_for(
        url(bridge),
        lambda s: total(s, "fsm_transitions_total", mode="inline", outcome="succeeded") >= 9,
    )
    assert total(applied, "fsm_ack_to_task_seconds_count", machine_type="test_linear") >= 6
    assert total(applied, "fsm_bridge_messages_total", outcome="finished") >= 9
    scanned = wait_for(
        url(worker), lambda s: total(s, "fsm_timeouts_total", machine_type="test_timeout") >= 1
    )
    assert total(scanned, "fsm_scan_duration_seconds_count") >= 1
    assert total(scanned, "fsm_retries_total", state="WAIT") >= 1
