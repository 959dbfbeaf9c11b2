"""The dashboard's GET /metrics: the fleet-wide gauges, computed when Prometheus scrapes, from
PostgreSQL (the folded statistics and indexed, bounded counts: fleet_queries) and Redis (the
ack streams' consumer group, the dead-letter stream) and Celery's broker (its queues, on Redis
or RabbitMQ).

One scrape reads each source once; a source that fails leaves its gauges out (and its error in
the log) rather than failing the scrape, so Prometheus still sees what it can, and
`fsm_scrape_errors` counts what it could not."""

from __future__ import annotations

import logging
import time
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime, timedelta
from functools import partial
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import redis
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from sqlalchemy import Connection, Engine

from fsm_celery.acks.dead import DEAD_STREAM
from fsm_celery.acks.streams import GROUP
from fsm_celery.config import Settings
from fsm_celery.core.definition import MachineDefinition
from fsm_celery.core.kinds import state_kind
from fsm_celery.core.messages import AGENT_ACK_STREAM, ack_stream
from fsm_celery.http import fleet_queries as fq
from fsm_celery.metrics.catalog import BY_NAME
from fsm_celery.store import agents as agent_store
from fsm_celery.store import partitions, reads, rollup
from fsm_celery.store import queries as q
from fsm_celery.store import schedules as schedule_store
from fsm_celery.worker.broker import QueueLengths, all_queues, queue_lengths

log = logging.getLogger(__name__)

STREAMS_READ = 1000  # agents' ack streams looked at in one scrape, at most

Family = GaugeMetricFamily | CounterMetricFamily
Families = dict[str, Family]
Zeros = dict[tuple[str, ...], float]  # each label set a gauge shows, at 0 unless counted


def _root(machine_type: str) -> str:
    return machine_type.split(".", 1)[0]


def _family(name: str) -> Family:
    spec = BY_NAME[name]
    if spec.kind.value == "counter":
        return CounterMetricFamily(name.removesuffix("_total"), spec.help, labels=spec.labels)
    return GaugeMetricFamily(name, spec.help, labels=spec.labels)


def _add(families: Families, name: str, labelled: Mapping[Any, float]) -> None:
    family = families.setdefault(name, _family(name))
    for labels, value in sorted(labelled.items()):
        family.add_metric(list(labels), value)


class Fleet:
    """A prometheus-client collector of the fleet-wide gauges (registered in the dashboard's
    own registry, never the process's: a scrape of it reads the fleet, nothing else)."""

    def __init__(
        self, settings: Settings, db: Engine, client: redis.Redis, broker: QueueLengths
    ) -> None:
        self.settings, self.db, self.client, self.broker = settings, db, client, broker
        self._definitions: dict[tuple[str, int], MachineDefinition] = {}

    def describe(self) -> Iterable[Metric]:
        return []  # computed at scrape time: nothing to check at registration

    def collect(self) -> Iterator[Metric]:
        families: Families = {}
        errors = 0
        for source in (self._database, self._streams, self._queues):
            try:
                source(families)
            except Exception as exc:  # a source away: its gauges left out, not the scrape
                errors += 1
                log.warning("fleet metrics: %s failed: %s", source.__name__, exc)
        _add(families, "fsm_build_info", {(_version(),): 1.0})
        _add(families, "fsm_scrape_errors", {(): errors})
        yield from families.values()

    # ---- PostgreSQL ---------------------------------------------------------------------

    def _database(self, families: Families) -> None:
        now = datetime.now(UTC)
        with self.db.connect() as conn:
            # every loaded type and agent type has its series, at 0 when nothing is counted:
            # a panel or an alert on one sees 0, not "no data"
            types: Zeros = {(_root(t),): 0.0 for t in reads.machine_types_txn(conn)}
            self._machines(conn, families)
            self._overdue(conn, now, types, families)
            self._agents(conn, now, set(reads.agent_types_txn(conn)), families)
            self._gates(conn, now, types, families)
            _add(families, "fsm_fanouts_open", types | _by_root(fq.fanouts_open_txn(conn)))
            _add(families, "fsm_events_kept", {(): fq.events_kept_txn(conn)})
            if self.db.dialect.name == "postgresql":
                listed = partitions.listed(conn, partitions.HISTORY)
                _add(families, "fsm_history_partitions", {(): len(listed)})
            last = schedule_store.last_run_txn(conn, "scan")
            if last is not None:
                seen = (last if last.tzinfo else last.replace(tzinfo=UTC)).timestamp()
                _add(families, "fsm_scan_last_seen_timestamp_seconds", {(): seen})

    def _machines(self, conn: Connection, families: Families) -> None:
        by_status: dict[tuple[str, ...], float] = defaultdict(float)
        tokens: dict[tuple[str, ...], float] = defaultdict(float)
        cost: dict[tuple[str, ...], float] = defaultdict(float)
        for count in rollup.machine_counts_txn(conn):
            root = _root(count.type)
            by_status[(root, count.status)] += count.total
            tokens[(root,)] += count.tokens
            cost[(root,)] += count.cost
        _add(families, "fsm_machines", by_status)
        _add(families, "fsm_usage_tokens_total", tokens)
        _add(families, "fsm_usage_cost_total", cost)

    def _overdue(self, conn: Connection, now: datetime, types: Zeros, families: Families) -> None:
        counts, earliest = fq.overdue_txn(conn, now)
        _add(families, "fsm_machines_overdue", types | _by_root(counts))
        age = 0.0
        if earliest is not None:
            earliest = earliest if earliest.tzinfo else earliest.replace(tzinfo=UTC)
            age = max(0.0, (now - earliest).total_seconds())
        _add(families, "fsm_oldest_overdue_seconds", {(): age})

    def _agents(self, conn: Connection, now: datetime, known: set[str], families: Families) -> None:
        since = now - timedelta(seconds=self.settings.agent_liveness_seconds)
        alive = agent_store.alive_agents_by_type_txn(conn, since)
        in_flight, queued = fq.work_waiting_txn(conn, partial(self._agents_work, conn))
        limits = fq.slot_limits_txn(conn)
        types = known | set(alive) | set(in_flight) | set(queued) | set(limits)
        _add(families, "fsm_agents_live", {(t,): alive.get(t, 0) for t in types})
        waiting = {(t,): in_flight.get(t, 0) + queued.get(t, 0) for t in types}
        _add(families, "fsm_work_waiting", waiting)
        free = {(t,): max(0, n - in_flight.get(t, 0)) for t, n in limits.items()}
        _add(families, "fsm_agent_slots_free", free)

    def _agents_work(self, conn: Connection, machine_type: str, version: int, state: str) -> bool:
        """Whether an agent works the state (not a gate, a wait, a tool call or a fan-out),
        by its definition's version, parsed once per process."""
        key = (machine_type, version)
        found = self._definitions.get(key)
        if found is None:
            root = q.definition_txn(conn, _root(machine_type), version)
            found = self._definitions[key] = root.at(machine_type)
        states = found.states_by_name
        return state in states and state_kind(states[state]) == "agent"

    def _gates(self, conn: Connection, now: datetime, types: Zeros, families: Families) -> None:
        counts, late = fq.open_gates_txn(conn, now, self.settings.approval_sla_fraction)
        _add(families, "fsm_approvals_waiting", types | _by_root(counts))
        _add(families, "fsm_approvals_past_sla", types | _by_root(late))

    # ---- Redis --------------------------------------------------------------------------

    def _streams(self, families: Families) -> None:
        """Each ack stream's backlog in the bridges' consumer group: the shared stream as
        `shared`, the agents' own streams summed by their agent's type (`agent:TYPE`)."""
        prefix = self.settings.channel_prefix
        pending: dict[tuple[str, ...], float] = defaultdict(float)
        oldest: dict[tuple[str, ...], float] = defaultdict(float)
        streams = [(ack_stream(prefix), "shared")]
        own = self._agent_streams(prefix)
        if own:
            with self.db.connect() as conn:
                types = agent_store.type_of_agents_txn(conn, list(own.values()))
            streams += [(s, f"agent:{types.get(a, 'unknown')}") for s, a in own.items()]
        now = time.time()
        for stream, label in streams:
            count, first = backlog(self.client, stream, GROUP)
            pending[(label,)] += count
            age = max(0.0, now - first) if first is not None else 0.0
            oldest[(label,)] = max(oldest[(label,)], age)
        _add(families, "fsm_acks_pending", pending)
        _add(families, "fsm_acks_oldest_pending_seconds", oldest)
        dead = int(self.client.xlen(prefix + DEAD_STREAM))
        _add(families, "fsm_dead_letters", {(): dead})

    def _agent_streams(self, prefix: str) -> dict[str, uuid.UUID]:
        head = prefix + AGENT_ACK_STREAM.format(agent="")
        found: dict[str, uuid.UUID] = {}
        for key in self.client.scan_iter(match=_glob(head) + "*", count=1000, _type="stream"):
            name = _text(key)
            try:
                found[name] = uuid.UUID(name[len(head) :])
            except ValueError:
                continue
            if len(found) >= STREAMS_READ:
                break
        return found

    def _queues(self, families: Families) -> None:
        """The Celery queues' lengths (tasks waiting for a worker: fsm.apply_acks batches and
        fsm.enter_state steps pile up here while no worker runs)."""
        lengths = self.broker(all_queues(self.settings))  # Redis's lists or RabbitMQ's queues
        _add(families, "fsm_celery_queue_length", {(n,): float(c) for n, c in lengths.items()})


def backlog(client: redis.Redis, stream: str, group: str) -> tuple[int, float | None]:
    """The entries of the stream the group holds and has not finished (delivered and not
    acknowledged, plus not yet delivered), and the oldest one's time (unix seconds): with no
    group yet, every entry of the stream."""
    try:
        groups: Any = client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream
        return 0, None
    info = next((g for g in groups if _text(g.get("name")) == group), None)
    if info is None:
        first: Any = client.xrange(stream, count=1)
        return int(client.xlen(stream)), _time_of(first[0][0]) if first else None
    pending, lag = int(info.get("pending") or 0), int(info.get("lag") or 0)
    times: list[float] = []
    if pending:
        summary: Any = client.xpending(stream, group)
        if summary.get("min"):
            times.append(_time_of(summary["min"]))
    if lag:
        after = "(" + _text(info.get("last-delivered-id") or "0-0")
        first = client.xrange(stream, min=after, count=1)
        if first:
            times.append(_time_of(first[0][0]))
    return pending + lag, min(times) if times else None


def _time_of(entry_id: bytes | str) -> float:
    return int(_text(entry_id).split("-", 1)[0]) / 1000


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _glob(text: str) -> str:
    return "".join(f"\\{c}" if c in "*?[]\\" else c for c in text)


def _by_root(counts: dict[str, int]) -> dict[tuple[str, ...], float]:
    rooted: dict[tuple[str, ...], float] = defaultdict(float)
    for machine_type, n in counts.items():
        rooted[(_root(machine_type),)] += n
    return rooted


def _version() -> str:
    try:
        return version("fsm-celery")
    except PackageNotFoundError:
        return "unknown"


def exposition(collector: Fleet) -> bytes:
    """The fleet's metrics in Prometheus's text format (one registry per scrape: the collector
    alone, computed now)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return generate_latest(registry)


def fleet(settings: Settings, db: Engine, connect: Callable[[str], redis.Redis]) -> Fleet:
    """The fleet's collector on the deployment's database, Redis and Celery broker."""
    return Fleet(settings, db, connect(settings.redis_url), queue_lengths(settings, connect))
