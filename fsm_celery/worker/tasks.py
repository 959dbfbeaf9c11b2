"""Celery tasks: thin, idempotent, taking ids. Each asks the engine and hands on what follows.

fsm.apply_acks applies a batch of agents' messages the bridge relayed (acks/relay.py, the
sending end); fsm.enter_state enters a state (worker/enqueue.py, the sending end);
fsm.call_tool makes a tool state's call (worker/tools.py, the sending end); beat runs the
engine's periodic work. What the tasks run on is a Worker's parts (worker/parts.py), given
by the worker's composition root (fsm_celery.celery, through fsm_celery.wiring).

In the worker, a message that can be neither applied nor recorded is tried again alone, a
second later, until the dead-letter policy gives up on it (acks/dead.py). Its tries travel with
it: a retry for the database being away is no try of the message, and a copy the bridge relayed
again starts its own count (the bridge counts the relays: acks/streams.py).
"""

from __future__ import annotations

import logging
import time
from typing import Any
from uuid import UUID

from celery import Task

from fsm_celery.acks.consumer import Envelope
from fsm_celery.acks.relay import APPLY_ACKS, Wire, acks_repr, wire
from fsm_celery.channel.transient import TRANSIENT
from fsm_celery.core.clock import utcnow
from fsm_celery.core.tool import Outcome
from fsm_celery.engine.ports import Inbound
from fsm_celery.engine.tools import Pending
from fsm_celery.metrics.celery import counted_retention, timed_scan
from fsm_celery.worker.app import app
from fsm_celery.worker.enqueue import ENTER_STATE
from fsm_celery.worker.parts import Worker
from fsm_celery.worker.tools import CALL_TOOL

log = logging.getLogger(__name__)

SCAN_BATCH = 500  # machines per scan transaction
# The engine's periodic work sends no events (send_events=False below): beat sends it every
# second, and Flower would list little else. Its failures are in the worker's log, its
# liveness in `fsm-celery doctor` (beat's last scan).

# How a task retries on the errors of its surroundings (fsm.apply_acks, fsm.enter_state and
# beat's periodic work): until they pass, with a growing, jittered delay.
RETRY: dict[str, Any] = {
    "autoretry_for": TRANSIENT,
    "retry_backoff": True,
    "retry_backoff_max": 30,
    "retry_jitter": True,
    "max_retries": None,
}


_worker: Worker | None = None


def provide(worker: Worker) -> None:
    """Run this process's tasks on these parts."""
    global _worker
    _worker = worker


def parts() -> Worker:
    """The parts this process's tasks run on."""
    if _worker is None:
        raise RuntimeError("fsm-celery's tasks run in a worker started with `celery -A fsm_celery`")
    return _worker


@app.task(name=APPLY_ACKS, bind=True, **RETRY)
def apply_acks(task: Task, messages: Wire) -> int:
    """Apply a batch of agent messages, as the bridge read them, in one transaction, and hand
    on the states it decided; how many messages it held.

    A redelivery (the worker died after the commit) finds every attempt already answered and
    records the acks as stale; the states it had decided are entered by the scan if their
    enter_state tasks were never sent.
    """
    run = parts()
    batch = unwire(messages, tries=task.request.retries + 1)
    failed = run.applier(batch)  # what it applied or recorded is settled on its streams
    parked, again = run.policy.sort(failed)
    if parked:
        run.settler.park(parked)
    if again:
        again = [d._replace(tries=d.tries + 1) for d in again]
        raise task.retry(args=(wire(again),), countdown=1, argsrepr=acks_repr(again))
    return len(batch)


def unwire(messages: Wire, tries: int) -> list[Envelope]:
    """The messages an fsm.apply_acks task carries (acks/relay.py's `wire`). A task sent by an
    earlier version carries fewer fields: without the source (its source is then "relayed"),
    the time stored, the entry (nothing to settle: the bridge did) or the tries (then `tries`,
    the task's runs)."""
    batch = []
    for raw, agent, *more in messages:
        source, at, entry, tried = [*more, None, None, None, None][:4]
        stored = float(at) if isinstance(at, int | float) else None  # when its stream stored it
        item = Inbound(str(raw), UUID(str(agent)) if agent else None, stored)
        count = int(tried) if isinstance(tried, int | float) else tries
        key = str(entry) if entry is not None else None
        batch.append(Envelope(item, str(source) if source else "relayed", count, key))
    return batch


@app.task(name=ENTER_STATE, **RETRY)
def enter_state(machine_id: str, attempt: int) -> None:
    """Dispatch the attempt's state_task (a no-op when it was dispatched already). Entered with
    those of the tasks that run meanwhile in this process, in one transaction (Worker.entries);
    alone when that transaction failed for a reason other than a transient one, so that a
    step that cannot be entered fails its own task only."""
    run = parts()
    step = (UUID(machine_id), attempt)
    if run.entries([step]):
        run.enqueue(run.engine.entry.enter_many([step]))


@app.task(name=CALL_TOOL, **RETRY)
def call_tool(machine_id: str, attempt: int) -> str:
    """Make a tool state's call and apply what it came to as the attempt's answer; a no-op
    when the machine is no longer at that attempt (a repeated or stale task). The call is
    made once a task: what it came to is applied, the database away or not (_finish), so
    that only a worker lost mid-call makes it again (at least once: tools should be
    idempotent, as any Celery task's work)."""
    run = parts()
    pending = run.engine.tools.pending(UUID(machine_id), attempt)
    if pending is None:
        return "nothing to call"
    outcome = run.caller.call(pending)
    if outcome is None:  # past the attempt's deadline: the scan times it out
        return "no result before the deadline"
    _finish(run, pending, outcome)
    return "called" if outcome.success else f"failed: {outcome.error}"


def _finish(run: Worker, pending: Pending, outcome: Outcome) -> None:
    """Apply the call's outcome, trying again while the database is away, until the
    attempt's deadline (then the scan times it out, and its retry calls again)."""
    wait = 0.5
    while True:
        try:
            next_states = run.engine.tools.finish(pending, outcome)
            break
        except TRANSIENT as exc:
            if utcnow() >= pending.deadline:
                log.warning("the call's outcome could not be applied before its deadline: %s", exc)
                return
            time.sleep(wait)
            wait = min(wait * 2, 10.0)
    try:
        run.enqueue(next_states)
    except TRANSIENT as exc:  # committed: the scan enters the next state when it is due
        log.warning("applied a tool call; its next states could not be handed on: %s", exc)


@app.task(name="fsm.scan", send_events=False, **RETRY)
@timed_scan
def scan() -> None:
    """Time out overdue attempts and enter due states (beat runs it every second)."""
    run = parts()
    while True:
        handled, next_states = run.engine.scan.run(SCAN_BATCH)
        run.enqueue(next_states)
        if handled < SCAN_BATCH:  # else a backlog: drain it now, batch after batch
            return


@app.task(name="fsm.run_schedules", send_events=False, **RETRY)
def run_schedules() -> int:
    """Start a machine for each schedule whose cron tick is due (beat runs it every second);
    how many schedules were due."""
    run = parts()
    due, next_states = run.engine.schedules.run()
    run.enqueue(next_states)
    return due


@app.task(name="fsm.fold_stats", send_events=False, **RETRY)
def fold_stats() -> int:
    """Fold the attempts recorded since the last fold into the statistics' counters (beat,
    every few seconds); how many."""
    return parts().engine.stats.fold()


@app.task(name="fsm.notify", send_events=False, **RETRY)
def send_notifications() -> int:
    """Send the notifications of machines that ended (beat, every second); how many went."""
    delivered, _ = parts().engine.notifier.send_due()
    return delivered


@app.task(name="fsm.history", send_events=False, **RETRY)
@counted_retention
def history() -> None:
    """Make the history's months ahead, and archive and remove those past their retention
    (beat, every hour; PostgreSQL only)."""
    parts().engine.retention.run()


@app.task(name="fsm.prune", send_events=False, **RETRY)
def prune() -> None:
    """Delete rejected messages and silent agents past their retention (beat, every minute)."""
    rejections, agents = parts().engine.scan.prune()
    if rejections or agents:
        log.info("pruned %d rejected messages and %d agents", rejections, agents)
