"""The agent SDK: a daemon that serves state_task messages with registered handlers
(docs/agents.md).

    agent = Agent("cto")                    # FSM_REDIS_URL, FSM_CHANNEL_PREFIX, FSM_REDIS_REPLICAS

    @agent.handler("cto_build_project", "WRITE_CODE")
    def write_code(task: Task) -> dict:     # or `async def`
        task.progress("compiling")          # a heartbeat, with progress text
        return {"filesCreated": [...]}      # the ack's output; raising sends a failed ack

    agent.run()                             # until SIGTERM / SIGINT / agent.stop()

Tasks are read from the agent's own stream and its agent type's stream through a consumer
group, at most `concurrency` at a time; acks, heartbeats and the agent's status go to the agent's
own ack stream (`stream:state:ack:<agent id>`), which under the deployment's Redis ACLs only this
agent may write: that is how the engine knows who sent them. A task whose entry was read but
never answered (the agent died) is read again when an agent with the same id starts, unless its
deadline has passed.

An answer is checked against the task's contract (its outputSchema) before it is sent: a broken
one runs the handler again with `task.problems` (up to `local_corrections` times), and a
`state_ack_refused` from the engine does the same within the attempt, its answer sent again.

An attempt the engine superseded is dropped: on its `state_cancel` (an operator paused,
cancelled, retried or forced the machine, or the attempt timed out), or when a newer attempt of
the same machine arrives.
Its slot is freed at once, its heartbeats stop and its answer is never sent; an async handler
is cancelled, a sync one is left to return into nothing (`task.cancelled` tells it to stop).
Stopping, the agent says so first, gives running handlers `shutdown_grace` seconds, then hands
back what they did not finish (`state_handback`), so that it goes at once to another agent,
without counting a retry, and exits: handlers run on daemon threads, which do not hold the
process.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from datetime import UTC, datetime
from typing import Any

import redis
from pydantic import ValidationError

from fsm_celery import traces
from fsm_celery.agent import identity
from fsm_celery.agent.task import (
    SHUTTING_DOWN,
    Failed,
    HandBack,
    Handler,
    NoAck,
    Recent,
    Slot,
    Task,
    handback,
    invalid_task_ack,
    reply,
    run_handler,
    sample_task,
)
from fsm_celery.channel.redis import Replication, connect
from fsm_celery.config import Settings
from fsm_celery.core.messages import (
    StateAckRefused,
    StateCancel,
    StateTask,
    agent_ack_stream,
    parse_task_message,
    task_stream,
)
from fsm_celery.metrics.agent import watch

__all__ = ["ANY", "Agent", "Failed", "HandBack", "Handler", "NoAck", "Task"]

log = logging.getLogger(__name__)

GROUP = "agents"
ANY = "*"
ACK_MAXLEN = 10_000  # entries kept on the agent's ack stream while no bridge reads it
LOCAL_CORRECTIONS = 2  # handler runs again on an answer that breaks its contract, before sending
TASKS_KEPT = 256  # answered tasks remembered, so that a refusal of their answer runs them again
CANCELLED_KEPT = 1_000  # cancelled attempts remembered, so a task read after its cancel is skipped
ANSWERED_KEPT = 1_000  # answers remembered, sent again for a task read again
REPLY_TRIES = 8  # sends of an answer (about 10 s in all) before it waits for the reconnect


class Agent:
    """A long-running agent of one agent type; register handlers, then run()."""

    def __init__(
        self,
        agent_type: str,
        *,
        redis_url: str | None = None,
        agent_id: uuid.UUID | str | None = None,
        concurrency: int = 4,
        prefix: str | None = None,
        status_interval: float = 5.0,
        shutdown_grace: float = 30.0,
        replicas: int | None = None,
        replica_timeout_ms: int | None = None,
        settings: Settings | None = None,
        local_corrections: int = LOCAL_CORRECTIONS,
    ) -> None:
        """What is not given is the deployment's, read from the environment as every process
        reads it (FSM_REDIS_URL, FSM_CHANNEL_PREFIX, FSM_REDIS_REPLICAS,
        FSM_REDIS_REPLICA_TIMEOUT_MS); the id, unless given, is the one the URL's credentials
        were issued to (`fsm-agent-<id>`), else a new one."""
        settings = settings or Settings()
        self.agent_type = agent_type
        self.redis_url = redis_url or settings.redis_url
        # The canonical form: the Redis ACL names its keys with it.
        self.id = identity.agent_id(agent_id, self.redis_url)
        self.concurrency = concurrency
        self.prefix = settings.channel_prefix if prefix is None else prefix
        self.status_interval = status_interval
        self.shutdown_grace = shutdown_grace
        self.local_corrections = local_corrections
        # an answer counts as sent once this many replicas hold it
        self.replicas = settings.redis_replicas if replicas is None else replicas
        self.replica_timeout_ms = replica_timeout_ms or settings.redis_replica_timeout_ms
        self._handlers: dict[tuple[str, str], Handler] = {}
        self._stop = threading.Event()
        self._stop_asked = 0.0  # monotonic time of stop(): the grace counts from it
        self._lock = threading.Lock()
        self._running: dict[tuple[str, str], Slot] = {}  # (stream, entry id) -> slot
        self._late: list[Slot] = []  # read after stop(): handed back, never started
        self._pending = False  # a task read while full, on the own stream: read it again
        self._rereading = False  # the read in hand is of the pending tasks, in their order
        self._unsent = False  # an answer given up on, its entry pending: read them all again
        self._cancelled: Recent[None] = Recent(CANCELLED_KEPT)
        # the answers sent lately: a task read again (its XACK lost in a failover, or sent
        # twice) gets the same answer again, without the handler's work done twice
        self._answered: Recent[dict[str, Any] | None] = Recent(ANSWERED_KEPT)
        self._tasks: Recent[StateTask] = Recent(TASKS_KEPT)  # answered
        self._client: redis.Redis | None = None
        self._replicated: Replication | None = None
        self._watch = watch(agent_type, self._running, settings)  # FSM_METRICS_PORT's /metrics

    # registration -----------------------------------------------------------------------

    def handler(self, machine_type: str = ANY, state: str = ANY) -> Callable[[Handler], Handler]:
        """Register the decorated function for a machine type and state ("*" matches any)."""

        def register(fn: Handler) -> Handler:
            self._handlers[(machine_type, state)] = fn
            return fn

        return register

    def handler_for(self, machine_type: str, state: str) -> Handler | None:
        """The most specific handler registered for the machine type and state."""
        for key in ((machine_type, state), (machine_type, ANY), (ANY, state), (ANY, ANY)):
            if key in self._handlers:
                return self._handlers[key]
        return None

    def answer_for(
        self, machine_type: str, state: str, context: Mapping[str, Any] | None = None
    ) -> dict[str, Any] | None:
        """The ack the handlers send for a task of that machine type and state, without Redis
        or an engine (a test's; None for no ack): a handler's error is a failed ack."""
        return self._answer(Task(sample_task(machine_type, state, context), lambda _: None))

    # running ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask run() to finish: no new tasks, running ones get shutdown_grace to finish."""
        if not self._stop.is_set():
            self._stop_asked = time.monotonic()
        self._stop.set()

    def run(self, install_signals: bool = True) -> None:
        """Serve tasks until stop() (or SIGTERM / SIGINT when install_signals)."""
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self.stop())
        traces.start("fsm-celery-agent")  # if OTEL_* asks for traces (docs/operations.md)
        status = threading.Thread(target=self._report_status, daemon=True)
        status.start()
        delay = 0.2
        while not self._stop.is_set():
            try:
                self._serve()
                delay = 0.2
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("agent %s lost Redis (%s); reconnecting in %.1fs", self.id, exc, delay)
                self._client = self._watch.reconnected()  # None: connect again, counted
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)
        status.join(2)  # its last "active" must not follow the "stopped"
        self._shut_down()

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = connect(self.redis_url)
            self._replicated = Replication(self._client, self.replicas, self.replica_timeout_ms)
        return self._client

    def _replication(self) -> Replication:
        self._redis()
        assert self._replicated is not None
        return self._replicated

    def _streams(self) -> dict[Any, Any]:
        return {
            task_stream(self.id, self.prefix): ">",
            task_stream(self.agent_type, self.prefix): ">",
        }

    def _ensure_groups(self) -> None:
        for stream in self._streams():
            try:
                self._redis().xgroup_create(stream, GROUP, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def _serve(self) -> None:
        self._ensure_groups()
        self._take({s: "0" for s in self._streams()})  # what this id read but never answered
        while not self._stop.is_set():
            try:
                self._take(self._next_streams())
            except redis.ResponseError as exc:  # Redis lost its data (FLUSHALL): a read
                if not any(lost in str(exc) for lost in ("NOGROUP", "UNBLOCKED")):  # blocked
                    raise  # on a stream deleted under it is UNBLOCKED; the next, NOGROUP
                self._ensure_groups()  # start the groups again

    def _next_streams(self) -> dict[Any, Any]:
        """Full, the agent's own stream only, where its cancels come (a task read meanwhile
        stays pending); a slot freed with tasks left pending, those first; an answer given up
        on, every stream's pending entries (each answered one gets its kept answer again)."""
        with self._lock:
            if self._unsent:  # an answer given up on: its entry is pending, read it again
                self._unsent = False
                return {stream: "0" for stream in self._streams()}
            full, pending = len(self._running) >= self.concurrency, self._pending
            self._pending = pending and full
        own = task_stream(self.id, self.prefix)
        return {own: ">"} if full else {own: "0"} if pending else self._streams()

    def _take(self, streams: dict[Any, Any]) -> int:
        """Read what the free slots allow (a cancel when full); how many tasks were started."""
        with self._lock:
            free = max(self.concurrency - len(self._running), 1)
        count = None if "0" in streams.values() else free  # pending: all, past the running
        self._rereading = count is None  # a task new to it waits behind those pending (_start)
        found: Any = self._redis().xreadgroup(GROUP, self.id, streams, count=count, block=1000)
        return sum(
            self._read(stream.decode(), entry_id.decode(), fields)
            for stream, entries in found or []
            for entry_id, fields in entries
        )

    def _read(self, stream: str, entry_id: str, fields: dict[bytes, bytes]) -> bool:
        """Start a task, or apply a cancel, read from a task stream; whether a task started."""
        if not fields:  # deleted while pending: nothing left to do
            self._done(stream, entry_id)
            return False
        with self._lock:
            if (stream, entry_id) in self._running:
                return False  # read again as pending (after a reconnect) while worked on
        raw = fields.get(b"message", b"")
        try:
            message = parse_task_message(raw)
        except ValidationError as exc:
            self._done(stream, entry_id, invalid_task_ack(raw, exc))  # a failed ack, if any
            return False
        if isinstance(message, StateCancel):
            self._cancel(message)
            self._done(stream, entry_id)
            return False
        if isinstance(message, StateAckRefused):
            return self._correct(stream, entry_id, message)
        return self._accept(Slot(stream, entry_id, message))

    def _correct(self, stream: str, entry_id: str, refused: StateAckRefused) -> bool:
        """Run the handler again on the task whose answer the engine refused, with its
        problems, and send the corrected answer (for the same attempt, the refusal's entry
        acknowledged with it); whether it started."""
        key = (str(refused.machine_id), refused.attempt)
        with self._lock:
            task = self._tasks.get(key)
        if task is None or not hmac.compare_digest(task.task_token, refused.task_token):
            log.warning("ignoring a state_ack_refused for %s attempt %d: not ours", *key)
            self._done(stream, entry_id)
            return False
        problems = [p.model_dump() for p in refused.problems]
        log.info("%s attempt %d refused, correcting: %s", *key, problems)
        slot = Slot(stream, entry_id, task, problems=problems)
        if self._stop.is_set() or self._stale(task) is not None:
            self._done(stream, entry_id, handback(task) if self._stop.is_set() else None)
            return False
        return self._start(slot)

    def _accept(self, slot: Slot) -> bool:
        task = slot.message
        key = (str(task.machine_id), task.attempt)
        with self._lock:
            answered, answer = key in self._answered, self._answered.get(key)
        if answered:
            log.info("%s attempt %d was answered already: same answer again", *key)
            self._done(slot.stream, slot.entry_id, answer)
            return False
        skip = self._stale(task)
        if skip is not None:
            log.info(
                "skipping %s %s attempt %d: %s", task.machine_id, task.state, task.attempt, skip
            )
            self._done(slot.stream, slot.entry_id)
            return False
        if self._stop.is_set():  # read in the last poll: another agent is to do it
            self._late.append(slot)
            return False
        for older in self._slots(lambda s: s.message.machine_id == task.machine_id):
            self._drop(older, f"superseded by attempt {task.attempt}")
        return self._start(slot)

    def _start(self, slot: Slot) -> bool:
        task = slot.message
        with self._lock:
            # read for a cancel (full), or new while older tasks wait: left pending, so that
            # one machine's next states cannot keep the others' waiting ones from the slots
            if len(self._running) >= self.concurrency or (self._pending and not self._rereading):
                self._pending = True
                return False
            self._running[slot.key] = slot
        name = f"agent-{self.id[:8]}-{task.state}"
        threading.Thread(target=self._work, args=(slot,), name=name, daemon=True).start()
        return True

    def _stale(self, task: StateTask) -> str | None:
        """Why the task is not to be worked on, or None."""
        if task.deadline <= datetime.now(UTC):
            return "its deadline passed"
        if (str(task.machine_id), task.attempt) in self._cancelled:
            return "the engine cancelled it"
        same = self._slots(lambda s: s.message.machine_id == task.machine_id)
        if any(s.message.attempt >= task.attempt for s in same):
            return "the machine's attempt being worked on is as new"
        return None

    def _slots(self, which: Callable[[Slot], bool]) -> list[Slot]:
        with self._lock:
            return [slot for slot in self._running.values() if which(slot)]

    def _cancel(self, cancel: StateCancel) -> None:
        """Drop the attempt the engine cancelled, if this agent works on it."""
        self._cancelled.keep((str(cancel.machine_id), cancel.attempt), None)
        for slot in self._slots(
            lambda s: (
                s.message.machine_id == cancel.machine_id and s.message.attempt == cancel.attempt
            )
        ):
            if hmac.compare_digest(slot.message.task_token, cancel.task_token):
                self._drop(slot, f"cancelled: {cancel.reason}")
            else:
                log.warning("ignoring a state_cancel for %s without its taskToken", slot.key)

    def _drop(self, slot: Slot, why: str, reply: dict[str, Any] | None = None) -> None:
        """Stop answering for the slot's attempt: free the slot, stop its heartbeats, cancel
        an async handler, and acknowledge its entry (with the reply given, never the handler's)."""
        with self._lock:
            if self._running.pop(slot.key, None) is None:
                return  # its handler finished first: its answer went out
            slot.cancelled.set()
            slot.ended.set()
        if slot.cancel_async is not None:
            slot.cancel_async()
        message = slot.message
        log.info(
            "dropped %s %s attempt %d: %s", message.machine_id, message.state, message.attempt, why
        )
        self._done(slot.stream, slot.entry_id, reply)

    def _work(self, slot: Slot) -> None:
        beats = threading.Thread(target=self._beat, args=(slot,), daemon=True)
        beats.start()
        task = Task(slot.message, self._send, slot)
        reply = traces.handled(task.message, self.agent_type, lambda: self._answer(task))
        with self._lock:
            mine = self._running.pop(slot.key, None) is not None
            slot.ended.set()
            if mine:
                key = (str(slot.message.machine_id), slot.message.attempt)
                self._answered.keep(key, reply)
                self._tasks.keep(key, slot.message)
        if mine:  # not dropped meanwhile: the answer counts
            self._done(slot.stream, slot.entry_id, reply)

    def _answer(self, task: Task) -> dict[str, Any] | None:
        """The handler's ack for the task (None for no ack, or when the task was dropped)."""
        message = task.message
        try:
            handler = self.handler_for(message.machine_type, message.state)
            if handler is None:
                raise LookupError(f"no handler for {message.machine_type} / {message.state}")
            output = run_handler(handler, task)
            for _ in range(self.local_corrections):  # the contract checked before sending
                task.problems = task.flaws(output)
                if not task.problems or task.cancelled:
                    break
                output = run_handler(handler, task)
            return reply(message, "state_ack", success=True, output=dict(output))
        except (NoAck, asyncio.CancelledError):
            return None
        except Exception as exc:
            if task.cancelled:
                return None  # it stopped because it was told to: nobody wants its error
            if isinstance(exc, HandBack):  # given back by the handler: sent again at once
                return reply(message, "state_handback", reason=str(exc))
            if isinstance(exc, Failed):  # failed as it says, with what it spent
                return reply(message, "state_ack", success=False, output=exc.output, error=str(exc))
            log.exception("handler for %s / %s failed", message.machine_type, message.state)
            error = f"{type(exc).__name__}: {exc}"
            return reply(message, "state_ack", success=False, output={}, error=error)

    def _beat(self, slot: Slot) -> None:
        message = slot.message
        window_ms = message.heartbeat_timeout or message.timeout
        interval = min(max(window_ms / 3000, 0.2), 30.0)
        while not slot.ended.wait(interval):
            try:
                self._send(reply(message, "state_heartbeat"))
            except redis.RedisError as exc:
                log.warning("heartbeat for %s failed: %s", message.machine_id, exc)

    def _send(self, message: dict[str, Any]) -> None:
        self._xadd(self._redis(), message)

    def _xadd(self, client: Any, message: dict[str, Any]) -> None:
        stream = agent_ack_stream(self.id, self.prefix)
        client.xadd(stream, {"message": json.dumps(message)}, maxlen=ACK_MAXLEN, approximate=True)

    def _done(self, stream: str, entry_id: str, reply: dict[str, Any] | None = None) -> None:
        """Send the reply (if any) and acknowledge the entry, in one round trip; with
        `replicas`, the reply counts as sent once that many replicas hold it, else it is sent
        again (a failover could lose it: a second copy is refused by the engine as stale)."""
        problem: Exception | None = None
        self._watch.done(reply)
        for tried in range(REPLY_TRIES):
            try:
                pipe = self._redis().pipeline(transaction=False)
                if reply is not None:
                    self._xadd(pipe, reply)
                pipe.xack(stream, GROUP, entry_id)
                pipe.xdel(stream, entry_id)
                waits = reply is not None and self._replication().wait_in(pipe)
                replies = pipe.execute()
                if waits:
                    self._replication().check(int(replies[-1]), "the answer")
                return
            except redis.RedisError as exc:
                problem = exc
            if reply is None or self._stop.is_set():
                break
            log.warning("answer on %s not sent for sure (%s); again", entry_id, problem)
            self._stop.wait(min(0.2 * 2**tried, 2.0))
        # The entry stays pending: this agent id reads its pending entries again at its next
        # read (and when it reconnects), and sends the answer it keeps for it (_answered). Not
        # only on a reconnect: the reading thread may ride a failover out on its client's own
        # retries, or have read the pending entries again while this one was still trying.
        log.warning("could not answer %s on %s: %s", entry_id, stream, problem)
        if reply is not None and not self._stop.is_set():
            with self._lock:
                self._unsent = True

    def _report_status(self) -> None:
        self._status("active")
        while not self._stop.wait(self.status_interval):
            self._status("active")

    def _status(self, status: str) -> None:
        with self._lock:
            running = len(self._running)
        message = {
            "type": "agent_status",
            "agentId": self.id,
            "agentType": self.agent_type,
            "status": status,
            "concurrency": self.concurrency,
            "running": running,
            "hostname": socket.gethostname(),
        }
        try:
            self._send(message)
        except redis.RedisError as exc:
            log.warning("could not report status: %s", exc)

    def _shut_down(self) -> None:
        """Say so, give running handlers the rest of the grace, then hand back what is left."""
        # Stopped first: nothing new is routed here, and a hand-back goes to another live agent.
        self._status("stopped")
        for slot in self._late:
            self._done(slot.stream, slot.entry_id, handback(slot.message))
        deadline = (self._stop_asked or time.monotonic()) + self.shutdown_grace
        while self._slots(lambda _: True) and time.monotonic() < deadline:
            time.sleep(0.05)
        for slot in self._slots(lambda _: True):
            self._drop(slot, SHUTTING_DOWN, handback(slot.message))
