"""The live feed: one subscription to channel:state:events per dashboard process, routed to the
connected pages (server-sent events), so that a hundred pages cost one Redis subscription and
no query of their own.

A page says what it wants (`Interest`): the machines it shows, the children of the machines it
shows (a fan-out's, by the event's parentId), and the starts of new machines that its filters
would show (which it then follows too); a tool may take everything. Events are routed by
machine id and parent id, so a page costs nothing for the transitions of machines it does not
show: at thousands of transitions a second, a list of fifty machines receives theirs alone.

While no page is connected the hub is not subscribed: Redis sends it nothing, so a dashboard
nobody looks at costs no CPU however busy the machines are (it unsubscribes IDLE_SECONDS after
the last page leaves, on the connection it keeps for the next one).

Each page has a bounded queue. A page that cannot keep up (its queue fills) is not waited for:
it is told to resync (reload what it shows) and its queue starts afresh. What arrives on the
channel is checked before it is routed: only a bounded state_event with a machine id goes
through, whatever else someone publishes there.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import defaultdict
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from fsm_celery.channel.redis import connect_async

log = logging.getLogger(__name__)
QUEUE = 1000  # events a page may fall behind by before it is told to resync
MAX_EVENT_BYTES = 8192  # a state_event is a few hundred bytes
MAX_FOLLOWED = 1000  # machines a page follows, those it asked for and those it saw start
RESYNC = "resync"
# redis-py's asyncio PubSub.aclose can hang in wait_closed (redis/redis-py#3941): every close,
# and the hub's stop, waits at most this long.
STOP_SECONDS = 2.0
# The last page gone, the hub stays subscribed this long before it unsubscribes (a page that
# reloads, or a visitor going from page to page, finds it subscribed still).
IDLE_SECONDS = 30.0
SUBSCRIBE_WAIT = 5.0  # a page waits this long at most for the hub's subscription


@dataclass(frozen=True)
class Interest:
    """What a page wants: these machines' events, their children's (parents), and (starts)
    those of new machines of the type and agent type given; everything when it names none."""

    machines: frozenset[str] = frozenset()
    starts: bool = False
    machine_type: str | None = None
    agent_type: str | None = None
    parents: frozenset[str] = frozenset()

    @property
    def everything(self) -> bool:
        return not self.machines and not self.starts and not self.parents

    def wants_start(self, event: dict[str, Any]) -> bool:
        return (self.machine_type is None or event.get("machineType") == self.machine_type) and (
            self.agent_type is None or event.get("agentType") == self.agent_type
        )


@dataclass(eq=False)
class Listener:
    """One connected page: what it wants, the machines it follows, and its queue."""

    interest: Interest
    followed: set[str] = field(default_factory=set)
    queue: asyncio.Queue[str] = field(default_factory=lambda: asyncio.Queue(QUEUE))


class EventHub:
    def __init__(self, redis_url: str, channel: str, idle_seconds: float = IDLE_SECONDS) -> None:
        self._url = redis_url
        self._channel = channel
        self._idle_seconds = idle_seconds
        self._everything: set[Listener] = set()
        self._starts: set[Listener] = set()
        self._by_machine: dict[str, set[Listener]] = defaultdict(set)
        self._by_parent: dict[str, set[Listener]] = defaultdict(set)
        self._count = 0
        self._task: asyncio.Task[None] | None = None
        self._wanted = asyncio.Event()  # set while a page listens
        self._live = asyncio.Event()  # set while subscribed
        self._behind: set[Listener] = set()  # went on before the subscription: told to resync
        self.received = 0

    @property
    def listeners(self) -> int:
        return self._count

    @property
    def subscribed(self) -> bool:
        return self._live.is_set()

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="event-hub")

    async def stop(self) -> None:
        """Stop listening; never waits more than STOP_SECONDS (a connection that hangs as it
        closes must not hold up the server's shutdown)."""
        task, self._task = self._task, None
        if task is None or task.done():  # never started, or stopped (maybe on another loop)
            return
        task.cancel()
        await asyncio.wait({task}, timeout=STOP_SECONDS)

    @contextlib.asynccontextmanager
    async def listen(self, interest: Interest = Interest()) -> AsyncIterator[Listener]:
        """A page's listener, once the hub is subscribed (so that it misses nothing from then
        on; when the subscription takes longer than SUBSCRIBE_WAIT, Redis away or slow, at
        once, and told to resync once it is subscribed)."""
        listener = Listener(interest)
        self._add(listener)
        try:
            if self._task is not None and not self._live.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._live.wait(), SUBSCRIBE_WAIT)
                if not self._live.is_set():
                    self._behind.add(listener)
            yield listener
        finally:
            self._remove(listener)

    def publish(self, raw: bytes | str) -> None:
        """Route one message of the channel to the pages that want it."""
        if not self._count:
            return  # nobody listens: not even worth reading
        event = _checked(raw)
        if event is None:
            return
        self.received += 1
        machine = event["machineId"]
        targets = set(self._everything)
        targets.update(self._by_machine.get(machine, ()))
        parent = event.get("parentId")
        if isinstance(parent, str):
            targets.update(self._by_parent.get(parent, ()))
        if event.get("event") == "start":
            for listener in self._starts:
                if listener.interest.wants_start(event) and self._follow(listener, machine):
                    targets.add(listener)
        text = raw.decode() if isinstance(raw, bytes) else raw
        for listener in targets:
            _send(listener, text)

    def _add(self, listener: Listener) -> None:
        self._count += 1
        self._wanted.set()
        interest = listener.interest
        if interest.everything:
            self._everything.add(listener)
        if interest.starts:
            self._starts.add(listener)
        for machine in list(interest.machines)[:MAX_FOLLOWED]:
            self._follow(listener, machine)
        for parent in list(interest.parents)[:MAX_FOLLOWED]:
            self._by_parent[parent].add(listener)

    def _follow(self, listener: Listener, machine: str) -> bool:
        if len(listener.followed) >= MAX_FOLLOWED:
            return False
        listener.followed.add(machine)
        self._by_machine[machine].add(listener)
        return True

    def _remove(self, listener: Listener) -> None:
        self._count -= 1
        if not self._count:
            self._wanted.clear()
        self._behind.discard(listener)
        self._everything.discard(listener)
        self._starts.discard(listener)
        for machine in listener.followed:
            followers = self._by_machine.get(machine)
            if followers is not None:
                followers.discard(listener)
                if not followers:
                    del self._by_machine[machine]
        for parent in listener.interest.parents:
            followers = self._by_parent.get(parent)
            if followers is not None:
                followers.discard(listener)
                if not followers:
                    del self._by_parent[parent]

    async def _run(self) -> None:
        """Subscribed while pages listen: idle_seconds after the last one leaves, the hub
        unsubscribes (Redis then sends it nothing, and nothing is read nor parsed), keeping its
        connection; the next page subscribes it again on that connection. A page that comes
        and goes costs neither a reconnect nor a resubscription in between."""
        delay = 0.5
        interrupted = False  # the feed broke while pages listened: they resync once it is back
        while True:
            await self._wanted.wait()  # nobody listens: no connection yet
            client = connect_async(self._url)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            try:
                while True:
                    await self._wanted.wait()
                    await pubsub.subscribe(self._channel)
                    self._live.set()
                    delay = 0.5
                    # events may have been missed meanwhile: by every page if the feed broke,
                    # by those that went on before this subscription if it was only late
                    behind, self._behind = self._behind, set()
                    for listener in self._all() if interrupted else behind:
                        _send(listener, RESYNC)
                    interrupted = False
                    await self._listen(pubsub)
                    self._live.clear()
                    await pubsub.unsubscribe(self._channel)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # Redis went away: listen again once it is back
                interrupted = True
                log.warning("event feed interrupted (%s); retrying in %.1f s", exc, delay)
                await asyncio.sleep(delay)
                delay = min(delay * 2, 10.0)
            finally:
                self._live.clear()
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(pubsub.aclose(), STOP_SECONDS)  # type: ignore[no-untyped-call]
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(client.aclose(), STOP_SECONDS)

    async def _listen(self, pubsub: Any) -> None:
        """Route the channel's messages until no page has listened for IDLE_SECONDS."""
        loop = asyncio.get_running_loop()
        idle_since: float | None = None
        while True:
            message = await pubsub.get_message(timeout=1.0)
            if message is not None and message.get("type") == "message":
                self.publish(message["data"])
            if self._count:
                idle_since = None
            elif idle_since is None:
                idle_since = loop.time()
            elif loop.time() - idle_since >= self._idle_seconds:
                return

    def _all(self) -> set[Listener]:
        found = self._everything | self._starts
        for followers in (*self._by_machine.values(), *self._by_parent.values()):
            found |= followers
        return found


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


def _send(listener: Listener, text: str) -> None:
    """Queue the text for the page; one that fell too far behind is told to resync instead."""
    try:
        listener.queue.put_nowait(text)
    except asyncio.QueueFull:
        while not listener.queue.empty():
            listener.queue.get_nowait()
        listener.queue.put_nowait(RESYNC)
