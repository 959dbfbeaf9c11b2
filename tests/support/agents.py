"""Agents in the test process: the SDK's on a thread, and a scripted one written with plain
redis-py (SUBSCRIBE to its channel, PUBLISH JSON acks), which answers as a test tells it."""

from __future__ import annotations

import json
import threading
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import redis

from fsm_celery.agent.sdk import Agent
from fsm_celery.core.messages import ack_channel, ack_stream, agent_ack_stream, task_channel
from tests.support.messages import Reply, ack_for, heartbeat_for
from tests.support.processes import FsmEnv


@contextmanager
def serving(agent: Agent) -> Iterator[Agent]:
    """The SDK agent running on a thread of the test process until the block ends."""
    thread = threading.Thread(target=agent.run, kwargs={"install_signals": False}, daemon=True)
    thread.start()
    try:
        yield agent
    finally:
        agent.stop()
        thread.join(10)


class ScriptedAgent:
    """An agent written with plain redis-py: SUBSCRIBE to its channel, PUBLISH JSON acks."""

    def __init__(
        self,
        env: FsmEnv,
        script: dict[str, list[Reply]] | None = None,
        copies: int = 1,
        gate: threading.Event | None = None,
        via_stream: bool = False,
        own_stream: bool = False,
        agent_id: str | None = None,
    ) -> None:
        self.id = agent_id or str(uuid.uuid4())  # a fixed one: the same agent in every test
        self.env = env
        self.script = {state: list(replies) for state, replies in (script or {}).items()}
        self.copies = copies
        self.gate = gate
        self.via_stream = via_stream
        self.own_stream = own_stream  # its own ack stream: the engine knows who sent it
        self.tasks: list[dict[str, Any]] = []
        self._pending: list[str] = []
        self._redis = redis.Redis.from_url(env.settings.redis_url)
        self._stop = threading.Event()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> ScriptedAgent:
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("agent did not subscribe")
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(5)

    def _run(self) -> None:
        pubsub = self._redis.pubsub(ignore_subscribe_messages=True)
        pubsub.subscribe(task_channel(self.id, self.env.settings.channel_prefix))
        self._ready.set()
        while not self._stop.is_set():
            message = pubsub.get_message(timeout=0.05)
            if message is not None:
                self._answer(json.loads(message["data"]))
            if self._pending and self.gate is not None and self.gate.is_set():
                for ack in self._pending:
                    self._publish(ack)
                self._pending.clear()
        pubsub.close()

    def _answer(self, task: dict[str, Any]) -> None:
        self.tasks.append(task)
        replies = self.script.get(task["state"])
        reply = replies.pop(0) if replies else Reply()
        beat_until = time.monotonic() + reply.heartbeat_for
        while time.monotonic() < beat_until and not self._stop.is_set():
            self.send(heartbeat_for(task, f"{beat_until - time.monotonic():.1f}s to go"))
            time.sleep(0.3)
        if reply.silent:
            return
        ack = json.dumps(ack_for(task, reply))
        if self.gate is not None and not self.gate.is_set():
            self._pending.append(ack)  # held until the gate opens
        else:
            self._publish(ack)

    def _publish(self, ack: str) -> None:
        for _ in range(self.copies):
            self.send(ack)

    def send(self, message: str | dict[str, Any]) -> None:
        """Send a raw message the way this agent does (PUBLISH, or XADD to the ack stream)."""
        text = message if isinstance(message, str) else json.dumps(message)
        prefix = self.env.settings.channel_prefix
        if self.own_stream:
            self._redis.xadd(agent_ack_stream(self.id, prefix), {"message": text})
        elif self.via_stream:
            self._redis.xadd(ack_stream(prefix), {"message": text})
        else:
            self._redis.publish(ack_channel(prefix), text)

    def wait_for_tasks(self, count: int, timeout: float = 15.0) -> dict[str, Any]:
        """The count-th state_task this agent received, once it arrived."""
        deadline = time.monotonic() + timeout
        while len(self.tasks) < count:
            if time.monotonic() > deadline:
                raise AssertionError(f"agent received {len(self.tasks)} of {count} tasks")
            time.sleep(0.02)
        return self.tasks[count - 1]

    def states(self) -> Iterator[str]:
        return (task["state"] for task in self.tasks)
