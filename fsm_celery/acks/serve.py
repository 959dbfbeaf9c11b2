"""The ack bridge's processes: its consumer processes (started again when one dies), their
signals and garbage-collector tuning. Each process has `build` (fsm_celery.wiring.ack_bridge,
given by the CLI) put its bridge together from the settings the CLI read once (`--inline` set
the transition mode in them), so that every part of every process reads one mode."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

from fsm_celery.acks.bridge import Bridge
from fsm_celery.config import Settings
from fsm_celery.traces import start as start_tracing

log = logging.getLogger("fsm_celery.acks.bridge")


@dataclass(frozen=True)
class Plan:
    """What each of the bridge's processes serves (picklable: spawned processes get it)."""

    build: Callable[..., Bridge]
    settings: Settings


def run_bridge(processes: int, plan: Plan) -> None:
    """The bridge with `processes` consumer processes (this one reads pub/sub too), until
    SIGINT or SIGTERM; a consumer process that dies is started again."""
    stop = threading.Event()
    _serve_metrics(plan.settings)
    others = [_spawn_consumer(n, plan) for n in range(1, processes)]
    threading.Thread(target=_keep_consumers, args=(others, plan, stop), daemon=True).start()
    threading.Thread(target=_keep_acl_users, args=(plan.settings, stop), daemon=True).start()
    serve_acks(plan, pubsub=True, stop=stop)
    # A signal sent to this process alone (pkill, docker stop, a supervisor) does not reach
    # the consumers: pass it on, so that they stop as this one did, at once.
    for process in others:
        if process.is_alive():
            process.terminate()
    for process in others:
        process.join(15)


def _serve_metrics(settings: Settings) -> None:
    """/metrics on FSM_METRICS_PORT, every consumer process's values added up (the processes
    spawned from now on write theirs where this one reads them)."""
    if settings.metrics_port:
        from fsm_celery.metrics import instruments

        instruments.use_multiprocess()
        instruments.serve(settings.metrics_port, settings.metrics_address, "ack bridge")
        instruments.count("fsm_redis_reconnects_total", "bridge", by=0)  # seen at 0
        for outcome in ("finished", "retried", "parked", "relayed_again"):
            instruments.count("fsm_bridge_messages_total", outcome, by=0)


def _spawn_consumer(number: int, plan: Plan) -> multiprocessing.process.BaseProcess:
    context = multiprocessing.get_context("spawn")
    process = context.Process(
        target=serve_acks,
        args=(plan,),
        kwargs={"pubsub": False},
        name=f"bridge-{number}",
        daemon=True,
    )
    process.start()
    return process


def _keep_consumers(
    processes: list[multiprocessing.process.BaseProcess], plan: Plan, stop: threading.Event
) -> None:
    """Start again, while the bridge runs, any consumer process that died."""
    while not stop.wait(1.0):
        for n, process in enumerate(processes):
            if not process.is_alive() and not stop.is_set():
                log.warning("%s exited (%s); starting it again", process.name, process.exitcode)
                processes[n] = _spawn_consumer(n + 1, plan)


def _keep_acl_users(settings: Settings, stop: threading.Event) -> None:
    """Create again, every acl.RESTORE_SECONDS, the agents' Redis users the primary lost: it
    restarted without an aclfile, or Sentinel promoted a replica (ACL users are not
    replicated). An agent refused meanwhile retries its connection until its user is back."""
    from fsm_celery.channel import acl
    from fsm_celery.channel.redis import connect
    from fsm_celery.store import agents as agent_store
    from fsm_celery.store import db as database

    db = database.connect(settings.database_url, prepare=settings.database_prepare)
    admin = connect(settings.redis_url)
    while not stop.wait(acl.RESTORE_SECONDS):
        try:
            with db.connect() as conn:
                users = agent_store.acl_users_txn(conn)
            created = acl.restore_users(admin, users)
        except Exception as exc:  # Redis or PostgreSQL away: the next round tries again
            log.debug("agents' Redis users not checked: %s", exc)
            continue
        if created:
            log.warning("Redis had lost %d agent users; created again: %s", len(created), created)


def serve_acks(plan: Plan, *, pubsub: bool, stop: threading.Event | None = None) -> None:
    """Serve the ack streams (and, with pubsub, the shared channel) until SIGINT or SIGTERM:
    apply each batch here (inline), or relay it to an fsm.apply_acks task (celery)."""
    settings = plan.settings
    settings.require_secret()
    logging.basicConfig(format="%(asctime)s %(processName)s %(levelname)s %(message)s")
    logging.getLogger("fsm_celery").setLevel(logging.INFO)
    _warn_about_trust(settings)
    start_tracing("fsm-celery-bridge")  # if OTEL_* asks for traces (docs/operations.md)
    bridge = plan.build(settings, pubsub=pubsub)
    log.info("transition mode: %s", settings.transition_mode)
    stopping = stop or threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    _quiet_gc()
    bridge.run(stopping)
    log.info("ack bridge stopped reading: told to stop")


def _warn_about_trust(settings: Settings) -> None:
    """Say loudly at start what the settings let anyone with write access to Redis do."""
    log = logging.getLogger("fsm_celery.trust")
    if settings.accept_shared_acks:
        log.warning(
            "FSM_ACCEPT_SHARED_ACKS is on: acks on the shared channel and stream (the seed's "
            "protocol) are accepted from anyone who can write to them, for any machine whose "
            "task token they hold; set it to false once every agent writes to its own stream"
        )
    if settings.accept_unsigned_acks:
        log.warning(
            "FSM_ACCEPT_UNSIGNED_ACKS is on: acks without a taskToken are accepted, so anyone "
            "who can write to an ack stream or channel can move any machine; never in production"
        )


def _quiet_gc() -> None:
    """Keep the cyclic garbage collector off the hot path: what was loaded at start is never
    collected again (gc.freeze), and young collections run a hundred times less often."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(70_000, 20, 100)
