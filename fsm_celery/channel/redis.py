"""The Redis side of the protocol: pub/sub as in the seed, and streams for durable delivery."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

import redis
import redis.asyncio as aioredis
from redis.asyncio.sentinel import Sentinel as AsyncSentinel
from redis.backoff import ExponentialBackoff
from redis.retry import Retry
from redis.sentinel import Sentinel

from fsm_celery.core.messages import StateEvent, events_channel, task_channel, task_stream
from fsm_celery.metrics.failovers import follow_failovers
from fsm_celery.redis_address import SentinelAddress, is_sentinel, parse_sentinel

log = logging.getLogger(__name__)

STREAM_MAXLEN = 10_000  # tasks kept per agent stream (approximate trimming)
STREAM_TTL_SECONDS = 7 * 24 * 3600  # a stream nobody writes to for a week is dropped
TTL_REFRESH_SECONDS = 60.0  # how often a dispatcher renews the TTL of a stream it writes to
SENTINEL_TIMEOUT = 2.0  # seconds to reach a sentinel, or a primary it names
FAILOVER_RETRIES = 3  # reconnects within one command (each asks the sentinels again)
REPLICAS_READ_SECONDS = 1.0  # how often a writer reads how many replicas its primary has


class NotReplicated(redis.ConnectionError):
    """Fewer replicas than asked acknowledged a write within the wait: a failover now could
    lose it, so it counts as not sent (a ConnectionError: tried again, as when Redis is down)."""


class Replication:
    """Writes that count as sent once the primary's replicas hold them (Redis WAIT), up to
    `wanted` of them. Redis replicates asynchronously, and Sentinel promotes a replica: what
    it did not hold is lost. A primary with fewer replicas connected (one was lost, the
    failover promoted the only one) waits for those it has: a replica that connects later
    copies everything it holds, and with none there is nothing a failover could promote.
    Its count of replicas (ROLE) is read again at most every REPLICAS_READ_SECONDS, and
    whenever a wait falls short."""

    def __init__(self, client: redis.Redis, wanted: int, timeout_ms: int) -> None:
        self._client = client
        self.wanted = wanted
        self._timeout_ms = timeout_ms
        self._connected = wanted  # until read: as many as wanted
        self._read_at = -REPLICAS_READ_SECONDS

    def wait_in(self, pipe: redis.client.Pipeline) -> bool:
        """End the pipeline with a WAIT if there are replicas to wait for; whether it does."""
        if not self.wanted:
            return False
        if time.monotonic() - self._read_at >= REPLICAS_READ_SECONDS:
            self._read_replicas()
        if not self.wanted or not self._connected:
            return False
        pipe.wait(min(self.wanted, self._connected), self._timeout_ms)
        return True

    def check(self, held: int, what: str) -> None:
        """NotReplicated unless `held` replicas are enough: as many as wanted, or every one
        the primary has now."""
        if held >= min(self.wanted, self._connected):
            return
        self._read_replicas()
        if held < min(self.wanted, self._connected):
            raise NotReplicated(
                f"{held} of {min(self.wanted, self._connected)} replicas hold {what} after "
                f"{self._timeout_ms} ms (FSM_REDIS_REPLICAS)"
            )

    def _read_replicas(self) -> None:
        try:
            role = self._client.execute_command("ROLE")  # type: ignore[no-untyped-call]
        except redis.exceptions.NoPermissionError:
            # an agent's Redis user made before FSM_REDIS_REPLICAS may run neither ROLE nor
            # WAIT: its answers go unconfirmed rather than not at all
            log.warning(
                "this Redis user may not run ROLE, so answers are not waited for on the "
                "replicas: give it WAIT and ROLE (fsm-celery agents credentials ID --apply)"
            )
            self.wanted = 0
            return
        self._connected = len(role[2]) if role and role[0] in (b"master", "master") else 0
        self._read_at = time.monotonic()


class RedisDispatcher:
    """PUBLISHes each state_task on the agent's channel and XADDs it to the agent's stream.

    A whole batch goes in one pipelined round trip. A pub/sub agent that is down misses the
    message and the state times out and is retried; a stream agent reads what it missed when it
    comes back. With `replicas`, the round trip ends with a WAIT: the batch counts as sent only
    once that many replicas hold it (Redis replicates asynchronously, and a failover promotes a
    replica: what it did not hold would be lost). Short of them, NotReplicated: the transaction
    that sent it rolls back and is tried again, and the agent may get the task twice (its
    second ack is refused as stale).
    """

    def __init__(
        self,
        client: redis.Redis,
        prefix: str = "",
        streams: bool = True,
        replicas: int = 0,
        replica_timeout_ms: int = 500,
    ) -> None:
        self._client = client
        self._prefix = prefix
        self._streams = streams
        # pub/sub is not kept for a reader: only the streams' entries are waited for
        self._replication = Replication(client, replicas if streams else 0, replica_timeout_ms)
        self._renewed: dict[str, float] = {}  # stream -> when its TTL was last set

    def dispatch_many(self, messages: list[tuple[str, str]]) -> None:
        if not messages:
            return
        pipe = self._client.pipeline(transaction=False)
        for agent, message in messages:
            pipe.publish(task_channel(agent, self._prefix), message)
            if self._streams:
                stream = task_stream(agent, self._prefix)
                pipe.xadd(stream, {"message": message}, maxlen=STREAM_MAXLEN, approximate=True)
        if self._streams:
            now = time.monotonic()
            for agent in {agent for agent, _ in messages}:
                stream = task_stream(agent, self._prefix)
                if now - self._renewed.get(stream, -TTL_REFRESH_SECONDS) >= TTL_REFRESH_SECONDS:
                    pipe.expire(stream, STREAM_TTL_SECONDS)
                    self._renewed[stream] = now
        waits = self._replication.wait_in(pipe)
        replies = pipe.execute()
        if waits:
            self._replication.check(int(replies[-1]), f"the {len(messages)} state_tasks")

    def cancel_many(self, messages: list[tuple[str, str]]) -> None:
        """XADD each state_cancel to the agent's task stream, all in one round trip.

        Not published: agents of the seed's pub/sub protocol would take it for a task.
        """
        if not messages or not self._streams:
            return
        pipe = self._client.pipeline(transaction=False)
        for agent, message in messages:
            stream = task_stream(agent, self._prefix)
            pipe.xadd(stream, {"message": message}, maxlen=STREAM_MAXLEN, approximate=True)
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("%d state_cancels not sent: %s", len(messages), exc)

    def announce(self, events: Sequence[StateEvent]) -> None:
        """PUBLISH each event on the events channel, all in one round trip."""
        if not events:
            return
        channel = events_channel(self._prefix)
        pipe = self._client.pipeline(transaction=False)
        for event in events:
            pipe.publish(channel, event.to_wire())
        try:
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("%d transition events not announced: %s", len(events), exc)


def connect(url: str) -> redis.Redis:
    """A Redis client with keepalive and health checks; for a redis+sentinel:// URL, one on
    the primary the sentinels name, asked again on every new connection (after a failover,
    the next command's reconnect finds the new primary; a demoted one's READONLY answer
    drops the connection: redis.sentinel.SentinelManagedConnection)."""
    if not is_sentinel(url):
        return redis.Redis.from_url(url, health_check_interval=30, socket_keepalive=True)
    address = parse_sentinel(url)
    sentinels = Sentinel(  # type: ignore[no-untyped-call]
        list(address.sentinels), sentinel_kwargs=_sentinel_login(address), socket_timeout=None
    )
    follow_failovers(sentinels)  # fsm_redis_failovers_total
    client: redis.Redis = sentinels.master_for(  # type: ignore[no-untyped-call]
        address.master,
        health_check_interval=30,
        socket_keepalive=True,
        socket_connect_timeout=SENTINEL_TIMEOUT,
        retry=Retry(ExponentialBackoff(cap=1.0, base=0.05), FAILOVER_RETRIES),
        **address.primary_kwargs,
    )
    return client


def connect_async(url: str) -> aioredis.Redis:
    """connect's asyncio client (the dashboard's live feed)."""
    if not is_sentinel(url):
        return aioredis.Redis.from_url(url)
    address = parse_sentinel(url)
    sentinels = AsyncSentinel(  # type: ignore[no-untyped-call]
        list(address.sentinels), sentinel_kwargs=_sentinel_login(address)
    )
    client: aioredis.Redis = sentinels.master_for(
        address.master, socket_connect_timeout=SENTINEL_TIMEOUT, **address.primary_kwargs
    )
    return client


def _sentinel_login(address: SentinelAddress) -> dict[str, Any]:
    """How to reach the sentinels themselves: their own login, and a bounded wait for each."""
    return {**address.sentinel_kwargs, "socket_timeout": SENTINEL_TIMEOUT}
