"""Celery settings for fsm-celery workers and beat, read from FSM_* environment variables.

Reliability choices:
- task_acks_late + task_reject_on_worker_lost: a task is acknowledged to the broker only after it
  ran, so a worker killed mid-task leaves the message to be redelivered. Every task is idempotent
  (it checks machine, attempt and state under a row lock), so a redelivery is harmless.
- worker_pool = "threads", worker_concurrency = 16: every fsm task runs for a millisecond or two
  and most of it waits on PostgreSQL or Redis. Threads in one process share its connections and
  skip the prefork pool's pickling of each task to a child and its result back; run one worker
  per CPU core. Measured at 1,000 machines in the celery mode (bench/throughput.py): two
  thread workers 207 transitions/s, two solo workers 199/s, one prefork worker of 2 processes
  100/s, on the same 2-core machine. `-P prefork` still works (every task is process-safe).
  Sixteen, not four: the fsm.apply_acks and fsm.enter_state tasks a process runs at once share
  one transaction (fsm_celery/worker/combine.py), and a task joins that round only once a thread
  runs it; a thread waiting for its round holds no connection and no CPU. A 10,000-item map in
  the celery mode (bench/fanout.py) took 36-52 s with 4 threads a worker, 31 s with 12, 27-28 s
  with 16 (single runs).
- worker_prefetch_multiplier = 2: with late acks, prefetched messages of a dead worker come back
  after the visibility timeout; a small prefetch bounds how many wait (32 a worker).
- timeouts are not countdown tasks: a countdown longer than the visibility timeout is
  redelivered while it waits, and a worker holds every pending countdown in memory. Deadlines
  and retry delays are columns in PostgreSQL, applied by the scan task that beat sends every
  second (FSM_SCAN_INTERVAL_SECONDS) with SELECT ... FOR UPDATE SKIP LOCKED, so any number of
  scans and workers can run at once and none applies a timeout twice. A short retry delay
  (at most half the visibility timeout) is also sent as an enter_state countdown, so that it
  is not late by a scan interval; the scan enters the state if that task is lost.
- RabbitMQ instead of Redis (FSM_BROKER_URL amqp://): quorum queues and publisher confirms
  (fsm_celery/worker/broker.py); no countdowns there, the scan enters a state whose retry is due.
- visibility_timeout (60 s): how long Redis waits before redelivering an unacknowledged message,
  the state entries a killed worker held among them. Every task runs for milliseconds, so a short
  one brings them back soon; a task redelivered while it still runs is harmless.
- autoretry on database and Redis connection errors (worker/tasks.py), with capped, jittered
  backoff: a PostgreSQL restart delays transitions, it does not drop them.
- task_ignore_result: the database holds every outcome; no result backend is needed.
"""

from __future__ import annotations

from pydantic import ValidationError

from fsm_celery.config import get_settings
from fsm_celery.worker.broker import all_queues, task_queue

try:
    _settings = get_settings()
except ValidationError as exc:  # `celery -A fsm_celery worker` with a bad FSM_* setting
    from fsm_celery.exits import fail

    fail(exc)

broker_url = _settings.celery_broker_url
broker_connection_retry_on_startup = True
broker_transport_options = _settings.celery_transport_options

task_default_queue = _settings.queue
# The nameless exchange routes by queue name alone. Named exchanges keep their bindings as Redis
# keys, and a FLUSHALL would make every later publish vanish silently until a worker restarts.
task_default_exchange = ""
task_default_routing_key = _settings.queue
# The engine's periodic work has a queue of its own (FSM_QUEUE.housekeeping), so that a backlog
# of transitions does not delay the scan nor the other way round; every worker consumes it
# whatever its -Q says (fsm_celery/worker/app.py), so nothing more needs starting. Those tasks
# send no events either: Flower lists the machines' tasks, not a scan every second.
HOUSEKEEPING = (
    "fsm.scan",
    "fsm.run_schedules",
    "fsm.fold_stats",
    "fsm.notify",
    "fsm.prune",
    "fsm.history",
)
# FSM_QUEUES gives machine types queues of their own (fsm_celery.worker.tasks routes each task
# by its machine's type): a worker without -Q consumes them all, `-Q fsm.research` just that one.
# On RabbitMQ (FSM_BROKER_URL amqp://) each is a quorum queue, with its delivery limit and
# dead-letter queue (fsm_celery/worker/broker.py); Celery then turns global QoS off for them
# (worker_detect_quorum_queues), the prefetch below counting per consumer.
task_queues = [task_queue(_settings, name) for name in all_queues(_settings)]
worker_detect_quorum_queues = True
task_routes = {name: {"queue": _settings.housekeeping_queue} for name in HOUSEKEEPING}
task_serializer = "json"
accept_content = ["json"]
task_ignore_result = True
task_acks_late = True
task_reject_on_worker_lost = True
worker_prefetch_multiplier = 2
worker_pool = "threads"
worker_concurrency = 16
worker_send_task_events = True  # for Flower
# No task-sent events: Flower lists a task from the worker's task-received event on, and a sent
# event is one more Redis PUBLISH per task, from every process that enqueues one.
task_send_sent_event = False

# Beat's record of when each periodic task last ran: in FSM_STATE_DIR, not wherever beat was
# started from (a celerybeat-schedule.* left in the working folder); the scheduler makes the
# folder. `-s PATH` still overrides it.
beat_scheduler = "fsm_celery.worker.beat:Scheduler"
beat_schedule_filename = str(_settings.state_directory / "celerybeat-schedule")

timezone = "UTC"
enable_utc = True

beat_schedule = {
    # Deadlines and due dispatches live in PostgreSQL; this scan applies them. It replaces one
    # countdown task per state (which a worker would hold in memory), and repairs anything a
    # killed worker, a lost message or a flushed Redis left behind.
    "fsm-scan": {"task": "fsm.scan", "schedule": _settings.scan_interval_seconds},
    # The definitions' schedules (fsm-celery schedules): a machine per due cron tick. Any number
    # of beats may run: a tick starts one machine (its row's primary key in PostgreSQL).
    "fsm-schedules": {"task": "fsm.run_schedules", "schedule": _settings.schedule_interval_seconds},
    # The statistics' counters (GET /api/stats, fsm-celery stats) keep up with the history.
    "fsm-fold-stats": {"task": "fsm.fold_stats", "schedule": _settings.stats_interval_seconds},
    # Notifications of machines that ended: sent, retried with backoff, never in a transition.
    "fsm-notify": {"task": "fsm.notify", "schedule": 1.0},
    # Rejected messages and silent agents past their retention, a few thousand rows at a time.
    "fsm-prune": {"task": "fsm.prune", "schedule": 60.0},
    # The history's monthly partitions (PostgreSQL): the months ahead made, those past
    # FSM_HISTORY_RETENTION_DAYS archived and removed without a lock that stops a transition.
    "fsm-history": {"task": "fsm.history", "schedule": 3600.0},
}
