"""Sentinel failovers followed: a process's Redis clients behind Sentinel ask it for the master
on every new connection (fsm_celery.channel.redis.connect); a master other than the one this
process saw last is a failover, counted once per process however many clients follow it
(fsm_redis_failovers_total)."""

from __future__ import annotations

import threading
from typing import Any

from fsm_celery.metrics.instruments import count

_masters: dict[str, Any] = {}  # each service's master, as this process saw it last
_lock = threading.Lock()


def seen(service: str, address: Any) -> bool:
    """Note the master the sentinels named for the service; whether it is a new one (a
    failover: another master was seen before)."""
    with _lock:
        known = _masters.get(service)
        _masters[service] = address
    return known is not None and known != address


def follow_failovers(sentinels: Any) -> None:
    """Count the failovers the clients of this Sentinel manager follow."""
    discover = sentinels.discover_master

    def discover_master(service_name: str) -> Any:
        address = discover(service_name)
        if seen(service_name, address):
            count("fsm_redis_failovers_total")
        return address

    sentinels.discover_master = discover_master
