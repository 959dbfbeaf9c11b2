"""Every metric fsm-celery exposes, declared once: its name, kind, labels and meaning.

The processes make their instruments from these (fsm_celery.metrics.instruments), the dashboard
its fleet-wide gauges (fsm_celery.http.fleet), and docs/operations.md its table
(fsm_celery.metrics.reference, `make docs`). Names follow Prometheus's conventions: base units
(seconds), `_total` for counters, low-cardinality labels (a machine's ROOT type, state names,
agent types; never a machine's id). The names are a contract with the alert rules and the
Grafana dashboard (deploy/): renaming one needs both sides.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum
from typing import Literal


class Kind(StrEnum):
    COUNTER = "counter"
    GAUGE = "gauge"
    HISTOGRAM = "histogram"


class Where(StrEnum):
    """Who serves a metric: every long-running process its own, or the dashboard the fleet's."""

    PROCESS = "process"  # worker, beat, ack bridge, SDK agent: FSM_METRICS_PORT's /metrics
    FLEET = "fleet"  # the dashboard's GET /metrics, computed at scrape time


# Latencies of one hop to a few minutes (an ack to its next task, a scan run).
FAST = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0)
# An agent's attempt, a fan-out: seconds to hours.
SLOW = (0.1, 0.5, 1.0, 5.0, 15.0, 30.0, 60.0, 300.0, 900.0, 1800.0, 3600.0, 4 * 3600.0, 86400.0)


@dataclass(frozen=True)
class Metric:
    name: str
    kind: Kind
    labels: tuple[str, ...]
    help: str
    where: Where = Where.PROCESS
    served_by: str = "worker, bridge (inline)"
    buckets: tuple[float, ...] = FAST
    # how a prefork worker's (or a bridge's) processes' values add up (prometheus-client's
    # multiprocess mode; gauges only)
    multiprocess_mode: Literal["livesum", "max"] = "livesum"


P, F = Where.PROCESS, Where.FLEET
C, G, H = Kind.COUNTER, Kind.GAUGE, Kind.HISTOGRAM
ENGINE = "worker, bridge (inline)"  # where transactions of agents' messages are applied

METRICS: tuple[Metric, ...] = (
    Metric(
        "fsm_transitions_total",
        C,
        ("machine_type", "mode", "outcome"),
        "Transitions applied, by outcome: succeeded, failed, retried, timed_out, handed_back, "
        "refused, cancelled, other.",
        served_by="worker, bridge (inline), dashboard (its commands)",
    ),
    Metric(
        "fsm_ack_to_task_seconds",
        H,
        ("machine_type", "mode"),
        "An ack stored in its stream (the entry id's time) to its next state's state_task "
        "sent (inline) or its fsm.enter_state task sent (celery).",
    ),
    Metric(
        "fsm_attempt_duration_seconds",
        H,
        ("machine_type", "state"),
        "A state attempt, entered to decided.",
        buckets=SLOW,
    ),
    Metric("fsm_retries_total", C, ("machine_type", "state"), "Attempts retried."),
    Metric(
        "fsm_timeouts_total",
        C,
        ("machine_type", "state"),
        "Attempts timed out by the scan.",
        served_by="worker",
    ),
    Metric("fsm_scan_duration_seconds", H, (), "One scan run.", served_by="worker"),
    Metric(
        "fsm_scan_last_run_timestamp_seconds",
        G,
        (),
        "When the last scan finished (unix time).",
        served_by="worker",
        multiprocess_mode="max",
    ),
    Metric(
        "fsm_dead_letters_total",
        C,
        (),
        "Messages parked in the dead-letter stream.",
        served_by="worker, bridge",
    ),
    Metric(
        "fsm_bridge_messages_total",
        C,
        ("outcome",),
        "Agents' messages an ack bridge read, by what became of them: finished (applied, "
        "relayed to an fsm.apply_acks task, or recorded as rejected), retried, parked; and "
        "relayed_again: relayed, and not settled by a worker in FSM_RELAY_TIMEOUT_SECONDS.",
        served_by="bridge",
    ),
    Metric("fsm_unprocessable_total", C, (), "Messages recorded as unprocessable."),
    Metric(
        "fsm_rejected_messages_total",
        C,
        ("reason",),
        "Messages recorded as rejected, by reason (stale_attempt, bad_token, wrong_agent, ...).",
    ),
    Metric(
        "fsm_join_seconds",
        H,
        ("machine_type",),
        "A fan-out state entered (its children started) to joined; the join itself is "
        "decided in the transaction of the child's ack that meets its policy.",
        buckets=SLOW,
    ),
    Metric(
        "fsm_events_total",
        C,
        ("outcome",),
        "Outside events: applied, kept (for a state not yet entered), duplicate, refused.",
        served_by="dashboard (events come through its API)",
    ),
    Metric(
        "fsm_budget_refusals_total",
        C,
        ("machine_type",),
        "Machines paused past their budget.",
    ),
    Metric(
        "fsm_redis_reconnects_total",
        C,
        ("role",),
        "Reconnects to Redis after a lost connection (role: bridge, agent).",
        served_by="bridge, SDK agent",
    ),
    Metric(
        "fsm_redis_failovers_total",
        C,
        (),
        "Sentinel failovers followed (a new master's address seen), once per process.",
        served_by="bridge, SDK agent, worker",
    ),
    Metric(
        "fsm_retention_runs_total",
        C,
        ("outcome",),
        "History retention runs: ran, or failed (it raised; a month whose archive or removal "
        "failed is in the worker's log).",
        served_by="worker",
    ),
    Metric(
        "fsm_beat_sends_total",
        C,
        ("task",),
        "Periodic tasks beat sent (fsm.scan, fsm.run_schedules, ...).",
        served_by="beat",
    ),
    Metric(
        "fsm_agent_tasks_total",
        C,
        ("agent_type", "outcome"),
        "Tasks an SDK agent answered: succeeded, failed, handed_back, dropped.",
        served_by="SDK agent",
    ),
    Metric(
        "fsm_agent_running",
        G,
        ("agent_type",),
        "Tasks an SDK agent has in hand.",
        served_by="SDK agent",
    ),
    # ---- fleet-wide: the dashboard's GET /metrics, from PostgreSQL and Redis at scrape time
    Metric("fsm_machines", G, ("machine_type", "status"), "Machines by status.", F, "dashboard"),
    Metric(
        "fsm_machines_overdue",
        G,
        ("machine_type",),
        "Running machines whose deadline passed more than 30 s ago.",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_oldest_overdue_seconds",
        G,
        (),
        "How long past its deadline the most overdue running machine is (0 if none).",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_acks_pending",
        G,
        ("stream",),
        "Entries of each ack stream delivered and not acknowledged by the bridge's consumer "
        "group, plus those not yet delivered.",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_acks_oldest_pending_seconds",
        G,
        ("stream",),
        "Age of the oldest such entry.",
        F,
        "dashboard",
    ),
    Metric("fsm_dead_letters", G, (), "Length of the dead-letter stream.", F, "dashboard"),
    Metric(
        "fsm_agents_live",
        G,
        ("agent_type",),
        "Agents that reported within FSM_AGENT_LIVENESS_SECONDS.",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_agent_slots_free",
        G,
        ("agent_type",),
        "Free slots of bounded agent types (max_in_flight).",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_work_waiting",
        G,
        ("agent_type",),
        "Running agent states waiting on an agent of the type (dispatched, not answered), "
        "plus machines queued for a slot.",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_fanouts_open",
        G,
        ("machine_type",),
        "Fan-out states waiting for their children.",
        F,
        "dashboard",
    ),
    Metric("fsm_approvals_waiting", G, ("machine_type",), "Approval gates open.", F, "dashboard"),
    Metric(
        "fsm_approvals_past_sla",
        G,
        ("machine_type",),
        "Approval gates open past FSM_APPROVAL_SLA_FRACTION of their deadline.",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_events_kept",
        G,
        (),
        "Outside events kept for a state not yet entered.",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_usage_tokens_total",
        C,
        ("machine_type",),
        "Tokens the machines used (folded statistics).",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_usage_cost_total",
        C,
        ("machine_type",),
        "Their cost, in the budgets' currency (folded statistics).",
        F,
        "dashboard",
    ),
    Metric("fsm_history_partitions", G, (), "Monthly partitions of the history.", F, "dashboard"),
    Metric(
        "fsm_scan_last_seen_timestamp_seconds",
        G,
        (),
        "When beat's scan last ran, as the database records it (doctor's beat's last scan).",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_celery_queue_length",
        G,
        ("queue",),
        "Tasks waiting in each Celery queue of the deployment (FSM_QUEUE, FSM_QUEUES's, the "
        "housekeeping queue): apply_acks batches and enter_state steps pile up here while no "
        "worker consumes (on a Redis or a RabbitMQ broker).",
        F,
        "dashboard",
    ),
    Metric(
        "fsm_scrape_errors",
        G,
        (),
        "Sources (database, streams, queues) this scrape of the dashboard could not read.",
        F,
        "dashboard",
    ),
    Metric("fsm_build_info", G, ("version",), "1, labelled with the version.", F, "dashboard"),
)

BY_NAME = {m.name: m for m in METRICS}
