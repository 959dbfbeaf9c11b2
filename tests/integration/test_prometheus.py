"""A real Prometheus (Debian's) scraping a real deployment in the celery mode: a worker, beat, an
ack bridge, the mock agents and the dashboard, each serving its /metrics; the alert rules of
deploy/prometheus/alerts.yml evaluated every second (a copy whose `for:` and windows are seconds,
tests/support/prometheus.py). The tests run in order, as an on-call night would: everything
scraped; the agents killed with work waiting (an alert fires); the worker stopped while the
agents answer (acks pile up, and a deadline passes with no scan: two alerts fire); then every
panel of the Grafana dashboard has data for the run."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import pytest
from celery import Celery

from fsm_celery.agent.sdk import Agent, Task
from fsm_celery.core.messages import ack_channel
from tests.support.agents import serving
from tests.support.credentials import ADMIN_TOKEN, VIEWER_TOKEN
from tests.support.processes import FsmEnv, Proc
from tests.support.prometheus import (
    Prometheus,
    grafana_variables,
    panel_queries,
    quick_rules,
)
from tests.support.services import free_port

MOCK = ("--mock", "--agent-type", "cto", "--agent-type", "tester", "--agent-type", "docwriter")
FIX_BUG = {"projectName": "sla-api", "githubIssue": 726}
BUILD = {"projectName": "sla-api", "githubIssue": 727}
SILENT = ("--silent", "WAIT", "--silent", "FALLBACK")  # test_timeout's states: never answered
JOBS = ("fsm-worker", "fsm-beat", "fsm-bridge", "fsm-agent")


@dataclass
class Watched:
    """The deployment, the ports its processes serve /metrics on, and the Prometheus."""

    env: FsmEnv
    ports: dict[str, int]
    prometheus: Prometheus
    started: float
    dashboard: str
    agent: Proc | None = None
    worker: Proc | None = None
    machines: list[uuid.UUID] = field(default_factory=list)
    forgotten: uuid.UUID | None = None

    def start_agent(self, *flags: str) -> None:
        port = {"FSM_METRICS_PORT": str(self.ports["fsm-agent"])}
        self.agent = self.env.start_agent(*MOCK, *flags, extra_env=port)

    def start_worker(self) -> None:
        with metrics_port(self.env, self.ports["fsm-worker"]):
            self.worker = self.env.start_worker(beat=False, supervised=False)

    def firing(self, alert: str, **labels: str) -> list[dict[str, Any]]:
        return [
            found
            for found in self.prometheus.firing()
            if found["labels"]["alertname"] == alert and labels.items() <= found["labels"].items()
        ]


@contextmanager
def metrics_port(env: FsmEnv, port: int) -> Iterator[None]:
    """The processes started in the block serve /metrics on the port (FSM_METRICS_PORT is per
    process: one host, one port each)."""
    kept = env.settings
    env.settings = kept.model_copy(update={"metrics_port": port})
    try:
        yield
    finally:
        env.settings = kept


@pytest.fixture(scope="module")
def watched(
    env_factory: Callable[..., FsmEnv], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Watched]:
    # agents report every 5 s: live while they run, dead ten seconds after they are killed
    env = env_factory("prom", transition_mode="celery", agent_liveness_seconds=10.0)
    ports = {job: free_port() for job in JOBS}
    with metrics_port(env, ports["fsm-beat"]):
        env.start_beat()
    with metrics_port(env, ports["fsm-bridge"]):
        env.start_bridge()
    _, dashboard = env.start_dashboard()
    directory = tmp_path_factory.mktemp("prometheus")
    targets = {job: [f"127.0.0.1:{port}"] for job, port in ports.items()}
    prometheus = Prometheus.start(
        directory / "server",
        {**targets, "fsm-dashboard": [dashboard.removeprefix("http://")]},
        [quick_rules(directory / "rules")],
        bearer={"fsm-dashboard": VIEWER_TOKEN},
    )
    found = Watched(env, ports, prometheus, time.time(), dashboard)
    found.start_worker()
    found.start_agent(*SILENT)  # test_timeout's states: timed out, retried
    try:
        _run_the_day(found)
        yield found
    finally:
        prometheus.stop()


def _run_the_day(watched: Watched) -> None:
    """Machines of every kind the dashboard shows: completed ones, a fan-out joined, one at an
    approval gate, attempts timed out and retried, a rejected message, one paused past its
    budget; and beat's hourly history job, sent now."""
    env = watched.env
    client = env.client
    done = [client.start_machine("cto_fix_bug", FIX_BUG) for _ in range(2)]
    done.append(client.start_machine("cto_build_parallel", BUILD))
    timed_out = client.start_machine("test_timeout", {"who": "nobody"})
    gated = client.start_machine("cto_build_project", {**BUILD, "approveProduction": True})
    env.redis.publish(  # a forged ack: recorded as rejected
        ack_channel(env.settings.channel_prefix),
        json.dumps(
            {
                "type": "state_ack",
                "machineId": str(done[0]),
                "state": "ANALYZE_BUG",
                "success": True,
                "output": {},
                "attempt": 1,
                "taskToken": "forged",
            }
        ),
    )
    _send_history_job(env)
    for machine in done:
        assert env.wait_until_done(machine, timeout=90).status == "completed"
    assert env.wait_until_done(timed_out, timeout=60).status == "failed"
    env.wait_for_gate(gated, "APPROVE_PROD", timeout=90)
    assert env.wait_for_rejections(None, 1)
    # through the dashboard's API, which counts it: refused, the machine waits for no event
    _send_event(watched.dashboard, gated, "ci_passed")
    # last: the spender is a tester agent too, and would take the tester machines' tasks
    with serving(_spender(env)) as spender:
        budgeted = client.start_machine("test_budget", {}, agent_id=spender.id)
        _until(lambda: client.get_machine(budgeted).status == "paused", "over its budget")


def _spender(env: FsmEnv) -> Agent:
    """An SDK agent that reports 60 tokens per task (test_budget allows 100)."""
    agent = Agent(
        "tester",
        redis_url=env.settings.redis_url,
        prefix=env.settings.channel_prefix,
        status_interval=1.0,
        shutdown_grace=2.0,
    )

    @agent.handler("test_budget")
    def spend(task: Task) -> dict[str, Any]:
        return {"tokensUsed": 60, "cost": 0.01}

    return agent


def _send_event(dashboard: str, machine: uuid.UUID, name: str) -> None:
    request = urllib.request.Request(
        f"{dashboard}/api/machines/{machine}/events/{name}",
        data=b"{}",
        method="POST",
        headers={"Authorization": f"Bearer {ADMIN_TOKEN}", "Content-Type": "application/json"},
    )
    try:
        urllib.request.urlopen(request, timeout=30).close()
    except urllib.error.HTTPError as refused:  # counted too, as refused
        assert refused.code == 422, refused.read()


def _send_history_job(env: FsmEnv) -> None:
    app = Celery(broker=env.settings.celery_broker_url)
    app.conf.broker_transport_options = env.settings.celery_transport_options
    try:
        app.send_task("fsm.history", queue=env.settings.housekeeping_queue)
    finally:
        app.close()


def _until(found: Callable[[], bool], what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not found():
        if time.monotonic() > deadline:
            raise AssertionError(f"never {what} within {timeout:.0f} s")
        time.sleep(0.2)


def test_prometheus_scrapes_every_process_of_the_deployment(watched: Watched) -> None:
    every = {*JOBS, "fsm-dashboard"}
    health = watched.prometheus.wait_for(
        "every job's target up",
        lambda: (
            (found := watched.prometheus.targets()).keys() == every
            and all(state == ["up"] for state in found.values())
            and found
        ),
    )
    assert set(health) == every
    for job in every:  # each served some fsm_ metric of its own
        series = watched.prometheus.query(f'count({{job="{job}", __name__=~"fsm_.+"}})')
        assert series and float(series[0]["value"][1]) > 0, job


def test_an_agent_type_with_work_waiting_and_no_live_agent_fires_its_alert(
    watched: Watched,
) -> None:
    assert watched.agent is not None
    assert not watched.firing("FsmNoLiveAgent", agent_type="cto")
    watched.agent.kill()
    waiting = watched.env.client.start_machine("cto_fix_bug", FIX_BUG)
    watched.machines.append(waiting)
    [alert] = watched.prometheus.wait_for(
        "FsmNoLiveAgent firing for cto",
        lambda: watched.firing("FsmNoLiveAgent", agent_type="cto"),
    )
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["runbook_url"] == "docs/operations.md#fsmnoliveagent"
    assert alert["annotations"]["summary"].startswith("No live agent of type cto, ")


def test_acks_piling_up_with_the_worker_stopped_fire_their_alert(watched: Watched) -> None:
    env, queue = watched.env, watched.env.settings.queue
    watched.start_agent("--slow", "ANALYZE_BUG=8", *SILENT)  # back, 8 s per analysis
    coming = [env.client.start_machine("cto_fix_bug", FIX_BUG) for _ in range(3)]
    watched.machines += coming
    watched.forgotten = env.client.start_machine("test_timeout", {"who": "nobody"})
    for machine in [*coming, watched.forgotten]:  # entered, sent to the agents
        _until(lambda m=machine: env.client.get_machine(m).deadline_at is not None, "entered")
    assert watched.worker is not None
    watched.worker.stop()  # the bridge relays the answers as fsm.apply_acks; nobody applies
    [alert] = watched.prometheus.wait_for(
        f"FsmAcksNotApplied firing for {queue}",
        lambda: watched.firing("FsmAcksNotApplied", queue=queue),
    )
    assert alert["labels"]["severity"] == "critical"
    assert alert["annotations"]["summary"] == f"Tasks pile up in the Celery queue {queue}"
    assert all(env.client.get_machine(m).current_state == "ANALYZE_BUG" for m in coming)


def test_a_deadline_passed_with_no_scan_to_apply_it_fires_machines_overdue(
    watched: Watched,
) -> None:
    """The worker is still stopped: test_timeout's deadline (a second, five in its fallback)
    passed, and nothing times it out (the scan runs on a worker)."""
    [alert] = watched.prometheus.wait_for(
        "FsmMachinesOverdue firing for test_timeout",
        lambda: watched.firing("FsmMachinesOverdue", machine_type="test_timeout"),
    )
    assert alert["labels"]["severity"] == "warning"
    assert alert["annotations"]["runbook_url"] == "docs/operations.md#fsmmachinesoverdue"
    env = watched.env
    assert watched.forgotten is not None
    assert env.client.get_machine(watched.forgotten).status == "running"
    watched.start_worker()  # the acks waited in the broker: applied now, once; the scan runs
    for machine in watched.machines:
        assert env.wait_until_done(machine, timeout=120).status == "completed"
    assert env.wait_until_done(watched.forgotten, timeout=60).status in ("completed", "failed")


def test_every_panel_of_the_grafana_dashboard_has_data_for_the_run(watched: Watched) -> None:
    prometheus, started = watched.prometheus, watched.started

    def without_data() -> list[str]:
        return [
            f"{title}: {query}"
            for title, query in panel_queries()
            if not prometheus.query_range(grafana_variables(query, "10s"), started, time.time())
        ]

    missing = without_data()
    deadline = time.monotonic() + 30  # the last scrapes of what the steps above did
    while missing and time.monotonic() < deadline:
        time.sleep(2)
        missing = without_data()
    assert not missing, "panels without data:\n" + "\n".join(missing)
