"""The agent SDK: a daemon that serves state_task messages with registered handlers.

    agent = Agent("cto", redis_url="redis://127.0.0.1:6379/0")

    @agent.handler("cto_build_project", "WRITE_CODE")
    def write_code(task: Task) -> dict:
        task.progress("compiling")          # a heartbeat, with progress text
        return {"filesCreated": [...]}      # the ack's output; raising sends a failed ack

    agent.run()                             # until SIGTERM / SIGINT / agent.stop()

Tasks are read from the agent's own stream and its agent type's stream through a consumer
group, at most `concurrency` at a time; acks, heartbeats and the agent's status go to the agent's
own ack stream (`stream:state:ack:<agent id>`), which under the deployment's Redis ACLs only this
agent may write: that is how the engine knows who sent them. A task whose entry was read but
never answered (the agent died) is read again when an agent with the same id starts, unless its
deadline has passed. Stopping, the agent says so first, then hands back what it could not
finish (`state_handback`), so that it goes at once to another agent, without counting a retry.
"""

from __future__ import annotations

import json
import logging
import signal
import socket
import threading
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import redis
from pydantic import ValidationError

from fsm_celery.core.messages import StateTask, agent_ack_stream, task_stream

log = logging.getLogger(__name__)

GROUP = "agents"
ANY = "*"
ACK_MAXLEN = 10_000  # entries kept on the agent's ack stream while no bridge reads it


class NoAck(Exception):
    """Raised by a handler to send no ack at all (the state will time out)."""


@dataclass
class Task:
    """One state attempt handed to a handler."""

    message: StateTask
    _send: Callable[[dict[str, Any]], None] = field(repr=False)

    @property
    def machine_id(self) -> str:
        return str(self.message.machine_id)

    @property
    def machine_type(self) -> str:
        return self.message.machine_type

    @property
    def state(self) -> str:
        return self.message.state

    @property
    def attempt(self) -> int:
        return self.message.attempt

    @property
    def context(self) -> dict[str, Any]:
        return self.message.context

    @property
    def prompt(self) -> str:
        return self.message.prompt

    def progress(self, text: str) -> None:
        """Send a heartbeat now, with progress text shown on the machine."""
        self._send(_reply(self.message, "state_heartbeat", progress=text[:2000]))


Handler = Callable[[Task], Mapping[str, Any]]


class Agent:
    """A long-running agent of one agent type; register handlers, then run()."""

    def __init__(
        self,
        agent_type: str,
        *,
        redis_url: str = "redis://127.0.0.1:6379/0",
        agent_id: uuid.UUID | str | None = None,
        concurrency: int = 4,
        prefix: str = "",
        status_interval: float = 5.0,
        shutdown_grace: float = 30.0,
    ) -> None:
        self.agent_type = agent_type
        # The canonical form: the Redis ACL names its keys with it.
        self.id = str(uuid.UUID(str(agent_id)) if agent_id else uuid.uuid4())
        self.redis_url = redis_url
        self.concurrency = concurrency
        self.prefix = prefix
        self.status_interval = status_interval
        self.shutdown_grace = shutdown_grace
        self._handlers: dict[tuple[str, str], Handler] = {}
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._running: dict[str, StateTask] = {}  # entry id -> task being worked on
        self._handed_back: set[str] = set()
        self._client: redis.Redis | None = None

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

    # running ----------------------------------------------------------------------------

    def stop(self) -> None:
        """Ask run() to finish: no new tasks, running ones get shutdown_grace to finish."""
        self._stop.set()

    def run(self, install_signals: bool = True) -> None:
        """Serve tasks until stop() (or SIGTERM / SIGINT when install_signals)."""
        if install_signals and threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                signal.signal(sig, lambda *_: self.stop())
        pool = ThreadPoolExecutor(self.concurrency, thread_name_prefix=f"agent-{self.id[:8]}")
        status = threading.Thread(target=self._report_status, daemon=True)
        status.start()
        delay = 0.2
        while not self._stop.is_set():
            try:
                self._serve(pool)
                delay = 0.2
            except (redis.ConnectionError, redis.TimeoutError) as exc:
                log.warning("agent %s lost Redis (%s); reconnecting in %.1fs", self.id, exc, delay)
                self._client = None
                self._stop.wait(delay)
                delay = min(delay * 2, 5.0)
        self._shut_down(pool)
        status.join(2)

    def _redis(self) -> redis.Redis:
        if self._client is None:
            self._client = redis.Redis.from_url(self.redis_url, socket_keepalive=True)
        return self._client

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

    def _serve(self, pool: ThreadPoolExecutor) -> None:
        self._ensure_groups()
        self._take(pool, {s: "0" for s in self._streams()})  # what this id read but never answered
        while not self._stop.is_set():
            try:
                if not self._take(pool, self._streams()):
                    continue
            except redis.ResponseError as exc:
                if "NOGROUP" not in str(exc):
                    raise
                self._ensure_groups()  # Redis lost its data: start the groups again

    def _take(self, pool: ThreadPoolExecutor, streams: dict[Any, Any]) -> int:
        with self._lock:
            free = self.concurrency - len(self._running)
        if free <= 0:
            time.sleep(0.05)
            return 0
        found: Any = self._redis().xreadgroup(GROUP, self.id, streams, count=free, block=1000)
        taken = 0
        for stream, entries in found or []:
            for entry_id, fields in entries:
                if not fields:  # deleted while pending: nothing left to do
                    self._done(stream.decode(), entry_id.decode())
                elif self._accept(pool, stream.decode(), entry_id.decode(), fields):
                    taken += 1
        return taken

    def _accept(
        self, pool: ThreadPoolExecutor, stream: str, entry_id: str, fields: dict[bytes, bytes]
    ) -> bool:
        raw = fields.get(b"message", b"")
        try:
            task = StateTask.model_validate_json(raw)
        except ValidationError as exc:
            self._refuse(raw, exc)
            self._done(stream, entry_id)
            return False
        if task.deadline <= datetime.now(UTC):
            log.info(
                "skipping %s %s attempt %d: its deadline passed",
                task.machine_id,
                task.state,
                task.attempt,
            )
            self._done(stream, entry_id)
            return False
        with self._lock:
            self._running[entry_id] = task
        pool.submit(self._work, stream, entry_id, task)
        return True

    def _work(self, stream: str, entry_id: str, message: StateTask) -> None:
        task = Task(message, self._send)
        beating = threading.Event()
        beats = threading.Thread(target=self._beat, args=(message, beating), daemon=True)
        beats.start()
        reply: dict[str, Any] | None
        try:
            handler = self.handler_for(message.machine_type, message.state)
            if handler is None:
                raise LookupError(f"no handler for {message.machine_type} / {message.state}")
            output = handler(task)
            reply = _reply(message, "state_ack", success=True, output=dict(output))
        except NoAck:
            reply = None
        except Exception as exc:
            log.exception("handler for %s / %s failed", message.machine_type, message.state)
            reply = _reply(
                message, "state_ack", success=False, output={}, error=f"{type(exc).__name__}: {exc}"
            )
        finally:
            beating.set()
        with self._lock:
            handed_back = entry_id in self._handed_back
            self._running.pop(entry_id, None)
        self._done(stream, entry_id, None if handed_back else reply)

    def _beat(self, message: StateTask, done: threading.Event) -> None:
        window_ms = message.heartbeat_timeout or message.timeout
        interval = min(max(window_ms / 3000, 0.2), 30.0)
        while not done.wait(interval):
            try:
                self._send(_reply(message, "state_heartbeat"))
            except redis.RedisError as exc:
                log.warning("heartbeat for %s failed: %s", message.machine_id, exc)

    def _refuse(self, raw: bytes, exc: ValidationError) -> None:
        """Answer a state_task that breaks the schema with a failed ack naming the problem."""
        problem = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'message'}: {e['msg']}" for e in exc.errors()
        )
        log.error("refusing an invalid state_task: %s", problem)
        try:
            data = json.loads(raw)
            ack = {key: data[key] for key in ("machineId", "state", "attempt", "taskToken")}
        except (ValueError, TypeError, KeyError):
            return  # nothing to answer to: the engine will time the attempt out
        self._send(
            {
                "type": "state_ack",
                **ack,
                "success": False,
                "output": {},
                "error": f"invalid state_task: {problem}",
            }
        )

    def _send(self, message: dict[str, Any]) -> None:
        self._xadd(self._redis(), message)

    def _xadd(self, client: Any, message: dict[str, Any]) -> None:
        stream = agent_ack_stream(self.id, self.prefix)
        client.xadd(stream, {"message": json.dumps(message)}, maxlen=ACK_MAXLEN, approximate=True)

    def _done(self, stream: str, entry_id: str, reply: dict[str, Any] | None = None) -> None:
        """Send the reply (if any) and acknowledge the entry, in one round trip."""
        try:
            pipe = self._redis().pipeline(transaction=False)
            if reply is not None:
                self._xadd(pipe, reply)
            pipe.xack(stream, GROUP, entry_id)
            pipe.xdel(stream, entry_id)
            pipe.execute()
        except redis.RedisError as exc:
            # The entry stays pending: this agent id reads it again when it reconnects.
            log.warning("could not answer %s on %s: %s", entry_id, stream, exc)

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

    def _shut_down(self, pool: ThreadPoolExecutor) -> None:
        deadline = time.monotonic() + self.shutdown_grace
        while time.monotonic() < deadline:
            with self._lock:
                if not self._running:
                    break
            time.sleep(0.05)
        with self._lock:
            left = dict(self._running)
            self._handed_back.update(left)
        # Stopped first: a hand-back is then routed to another live agent, not back to this one.
        self._status("stopped")
        for message in left.values():
            reason = "the agent is shutting down"
            self._send(_reply(message, "state_handback", reason=reason))
        pool.shutdown(wait=False, cancel_futures=True)


def _reply(task: StateTask, kind: str, **fields: Any) -> dict[str, Any]:
    return {
        "type": kind,
        "machineId": str(task.machine_id),
        "state": task.state,
        "attempt": task.attempt,
        "taskToken": task.task_token,
        **fields,
    }
