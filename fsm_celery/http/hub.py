"""The live feed: one subscription to channel:state:events per dashboard process, fanned out to
every connected page (server-sent events), so that a hundred pages cost one Redis subscription
and no query of their own.

Each page has a bounded queue. A page that cannot keep up (its queue fills) is not waited for:
it is told to resync (reload what it shows) and its queue starts afresh. What arrives on the
channel is checked before it is passed on: only a bounded state_event with a machine id goes
through, whatever else someone publishes there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import redis.asyncio as aioredis

log = logging.getLogger(__name__)
QUEUE = 1000  # events a page may fall behind by before it is told to resync
MAX_EVENT_BYTES = 8192  # a state_event is a few hundred bytes
RESYNC = "resync"


@dataclass(eq=False)
class Listener:
    """One connected page: the events it wants (all, or one machine's) and its queue."""

    machine_id: str | None = None
    queue: asyncio.Queue[str] = field(default_factory=lambda: asyncio.Queue(QUEUE))

    def wants(self, event: dict[str, Any]) -> bool:
        return self.machine_id is None or event.get("machineId") == self.machine_id


class EventHub:
    def __init__(self, redis_url: str, channel: str) -> None:
        self._url = redis_url
        self._channel = channel
        self._listeners: set[Listener] = set()
        self._task: asyncio.Task[None] | None = None
        self.received = 0

    @property
    def listeners(self) -> int:
        return len(self._listeners)

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="event-hub")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    @contextlib.asynccontextmanager
    async def listen(self, machine_id: str | None = None) -> AsyncIterator[Listener]:
        listener = Listener(machine_id)
        self._listeners.add(listener)
        try:
            yield listener
        finally:
            self._listeners.discard(listener)

    def publish(self, raw: bytes | str) -> None:
        """Pass one message of the channel on to the pages that want it."""
        event = _checked(raw)
        if event is None:
            return
        self.received += 1
        text = raw.decode() if isinstance(raw, bytes) else raw
        for listener in list(self._listeners):
            if not listener.wants(event):
                continue
            try:
                listener.queue.put_nowait(text)
            except asyncio.QueueFull:
                _drain(listener.queue)
                listener.queue.put_nowait(RESYNC)

    async def _run(self) -> None:
        delay = 0.5
        while True:
            client = aioredis.Redis.from_url(self._url)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                await pubsub.subscribe(self._channel)
                delay = 0.5
                for listener in list(self._listeners):  # events may have been missed
                    listener.queue.put_nowait(RESYNC)
                while True:
                    message = await pubsub.get_message(timeout=5.0)
                    if message is not None and message.get("type") == "message":
                        self.publish(message["data"])
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away: listen again once it is back
                log.warning("event feed interrupted (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            finally:
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                with contextlib.suppress(Exception):
                    await client.aclose()


def _checked(raw: bytes | str) -> dict[str, Any] | None:
    if len(raw) > MAX_EVENT_BYTES:
        return None
    try:
        event = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    if not isinstance(event, dict) or event.get("type") != "state_event":
        return None
    if not isinstance(event.get("machineId"), str):
        return None
    return event


def _drain(queue: asyncio.Queue[str]) -> None:
    while not queue.empty():
        queue.get_nowait()
