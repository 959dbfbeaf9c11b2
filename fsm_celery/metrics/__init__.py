"""Prometheus metrics: the catalog of every metric (catalog.py), a process's instruments and
its /metrics server (instruments.py), the engine's Observer that counts what transactions did
(observer.py), the SDK agent's (agent.py); the dashboard's fleet-wide gauges are
fsm_celery.http.fleet's.

Importing this package, or agent.py, imports no prometheus_client: an SDK agent without
FSM_METRICS_PORT pays nothing for it."""
