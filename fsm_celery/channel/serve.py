"""Runs the ack bridge: its consumer processes (started again when one dies), its signals and
its garbage-collector tuning. What a bridge is made of is built in fsm_celery.wiring."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import signal
import threading

from fsm_celery.config import Settings, get_settings

log = logging.getLogger("fsm_celery.channel.bridge")


def run_bridge(processes: int, inline: bool) -> None:
    """The bridge with `processes` consumer processes (this one reads pub/sub too), until
    SIGINT or SIGTERM; a consumer process that dies is started again."""
    stop = threading.Event()
    others = [_spawn_consumer(n, inline) for n in range(1, processes)]
    threading.Thread(target=_keep_consumers, args=(others, inline, stop), daemon=True).start()
    serve_acks(True, inline, stop)
    # A signal sent to this process alone (pkill, docker stop, a supervisor) does not reach
    # the consumers: pass it on, so that they stop as this one did, at once.
    for process in others:
        if process.is_alive():
            process.terminate()
    for process in others:
        process.join(15)


def _spawn_consumer(number: int, inline: bool) -> multiprocessing.process.BaseProcess:
    context = multiprocessing.get_context("spawn")
    process = context.Process(
        target=serve_acks, args=(False, inline), name=f"bridge-{number}", daemon=True
    )
    process.start()
    return process


def _keep_consumers(
    processes: list[multiprocessing.process.BaseProcess], inline: bool, stop: threading.Event
) -> None:
    """Start again, while the bridge runs, any consumer process that died."""
    while not stop.wait(1.0):
        for n, process in enumerate(processes):
            if not process.is_alive() and not stop.is_set():
                log.warning("%s exited (%s); starting it again", process.name, process.exitcode)
                processes[n] = _spawn_consumer(n + 1, inline)


def serve_acks(pubsub: bool, inline: bool, stop: threading.Event | None = None) -> None:
    """Serve the ack streams (and the pub/sub channel) until SIGINT or SIGTERM: apply each
    batch here (inline), or hand it to an fsm.apply_acks task."""
    from fsm_celery.wiring import ack_bridge

    settings = get_settings()
    settings.require_secret()
    logging.basicConfig(format="%(asctime)s %(processName)s %(levelname)s %(message)s")
    logging.getLogger("fsm_celery").setLevel(logging.INFO)
    _warn_about_trust(settings)
    bridge = ack_bridge(settings, inline=inline, pubsub=pubsub)
    log.info("transition mode: %s", "inline" if inline else "celery (fsm.apply_acks tasks)")
    stopping = stop or threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: stopping.set())
    _quiet_gc()
    bridge.run(stopping)


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
