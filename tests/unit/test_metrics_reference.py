"""docs/operations.md's metrics table is the catalog's, and the catalog keeps Prometheus's
conventions and the names the alert rules and the dashboard are written against."""

from __future__ import annotations

import re

from fsm_celery.metrics.catalog import METRICS, Kind, Where
from fsm_celery.metrics.reference import BEGIN, END, OPERATIONS, metrics_reference

# docs: the contract of names between the metrics, the alert rules and the Grafana dashboard
CONTRACT = {
    "fsm_transitions_total",
    "fsm_ack_to_task_seconds",
    "fsm_attempt_duration_seconds",
    "fsm_retries_total",
    "fsm_timeouts_total",
    "fsm_scan_duration_seconds",
    "fsm_scan_last_run_timestamp_seconds",
    "fsm_dead_letters_total",
    "fsm_unprocessable_total",
    "fsm_rejected_messages_total",
    "fsm_join_seconds",
    "fsm_events_total",
    "fsm_budget_refusals_total",
    "fsm_redis_reconnects_total",
    "fsm_redis_failovers_total",
    "fsm_retention_runs_total",
    "fsm_agent_tasks_total",
    "fsm_agent_running",
    "fsm_machines",
    "fsm_machines_overdue",
    "fsm_oldest_overdue_seconds",
    "fsm_acks_pending",
    "fsm_acks_oldest_pending_seconds",
    "fsm_dead_letters",
    "fsm_agents_live",
    "fsm_agent_slots_free",
    "fsm_work_waiting",
    "fsm_fanouts_open",
    "fsm_approvals_waiting",
    "fsm_approvals_past_sla",
    "fsm_events_kept",
    "fsm_usage_tokens_total",
    "fsm_usage_cost_total",
    "fsm_history_partitions",
    "fsm_scan_last_seen_timestamp_seconds",
    "fsm_build_info",
}


def test_the_operations_page_lists_every_metric_as_the_code_declares_it() -> None:
    text = OPERATIONS.read_text()
    block = text.split(BEGIN, 1)[1].split(END, 1)[0]
    assert block == metrics_reference(), "docs/operations.md's metrics differ: run `make docs`"


def test_every_name_of_the_contract_is_declared() -> None:
    assert sorted(CONTRACT - {m.name for m in METRICS}) == []


def test_names_follow_prometheus_conventions() -> None:
    for m in METRICS:
        assert re.fullmatch(r"fsm_[a-z_]+", m.name), m.name
        assert m.name.endswith("_total") == (m.kind is Kind.COUNTER), m.name
        if m.kind is Kind.HISTOGRAM:
            assert m.name.endswith("_seconds"), m.name
        assert "machine_id" not in m.labels and "agent_id" not in m.labels, m.name
        assert m.help.endswith("."), m.name


def test_names_are_unique_and_each_has_a_server() -> None:
    names = [m.name for m in METRICS]
    assert len(names) == len(set(names))
    assert {m.where for m in METRICS} == {Where.PROCESS, Where.FLEET}
