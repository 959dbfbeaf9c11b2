"""Where Redis is: a plain URL (redis://, rediss://, unix://), or a Sentinel-managed primary:

    redis+sentinel://[[USER]:PASSWORD@]HOST:PORT[,HOST:PORT...]/MASTER[/DB][?OPTIONS]
    rediss+sentinel://...   the same, the primary and replicas reached over TLS

The hosts are the sentinels; MASTER is the name they monitor the primary by; USER and PASSWORD
are the primary's (the replicas share them). OPTIONS: `sentinel_password` and
`sentinel_username` (when the sentinels ask for their own), `ssl_ca_certs` (TLS). One setting
(FSM_REDIS_URL) so that every client of the project, the agent SDK's too, reads one address,
and a failover moves them all: each asks the sentinels for the primary whenever it connects.
Pure: parsing only (fsm_celery.channel.redis connects; the settings check the URL with it).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

SENTINEL_SCHEMES = ("redis+sentinel", "rediss+sentinel")
SENTINEL_PORT = 26379
OPTIONS = ("sentinel_password", "sentinel_username", "ssl_ca_certs")


@dataclass(frozen=True)
class SentinelAddress:
    """A Sentinel-managed primary: the sentinels, the master's name, and how to log in."""

    sentinels: tuple[tuple[str, int], ...]
    master: str
    db: int = 0
    username: str | None = None
    password: str | None = None
    tls: bool = False
    options: dict[str, str] = field(default_factory=dict)

    @property
    def sentinel_kwargs(self) -> dict[str, str]:
        """How to log in to the sentinels themselves."""
        kwargs = {}
        if "sentinel_password" in self.options:
            kwargs["password"] = self.options["sentinel_password"]
        if "sentinel_username" in self.options:
            kwargs["username"] = self.options["sentinel_username"]
        return kwargs

    @property
    def primary_kwargs(self) -> dict[str, Any]:
        """How a client reaches the primary the sentinels name: database, login, TLS."""
        found = {"db": self.db, "username": self.username, "password": self.password}
        return {**found, **self.tls_kwargs}

    @property
    def tls_kwargs(self) -> dict[str, Any]:
        if not self.tls:
            return {}
        found: dict[str, Any] = {"ssl": True}
        if "ssl_ca_certs" in self.options:
            found["ssl_ca_certs"] = self.options["ssl_ca_certs"]
        return found


def is_sentinel(url: str) -> bool:
    return url.split("://", 1)[0].lower() in SENTINEL_SCHEMES


def parse_sentinel(url: str) -> SentinelAddress:
    """The address a redis+sentinel:// URL names; ValueError saying what is wrong (the URL's
    password never repeated)."""
    parts = urlsplit(url)
    if parts.scheme.lower() not in SENTINEL_SCHEMES:
        raise ValueError(f"a Sentinel URL starts with {' or '.join(SENTINEL_SCHEMES)}://")
    userinfo, _, hosts = parts.netloc.rpartition("@")
    sentinels = tuple(_host(h) for h in hosts.split(",") if h.strip())
    if not sentinels:
        raise ValueError("a Sentinel URL names at least one sentinel, host:port")
    path = [p for p in parts.path.split("/") if p]
    if not path or len(path) > 2:
        raise ValueError("a Sentinel URL's path is /MASTER or /MASTER/DB (the master's name)")
    db = 0
    if len(path) == 2:
        if not path[1].isdigit():
            raise ValueError(f"the database number {path[1]!r} is not a whole number")
        db = int(path[1])
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    query = parse_qs(parts.query, keep_blank_values=True)
    unknown = sorted(set(query) - set(OPTIONS))
    if unknown:
        raise ValueError(f"unknown option {unknown[0]!r} (known: {', '.join(OPTIONS)})")
    return SentinelAddress(
        sentinels=sentinels,
        master=unquote(path[0]),
        db=db,
        username=unquote(username) or None,
        password=unquote(password) or None,
        tls=parts.scheme.lower().startswith("rediss"),
        options={k: v[-1] for k, v in query.items()},
    )


def _host(text: str) -> tuple[str, int]:
    host, sep, port = text.strip().rpartition(":")
    if not sep:
        return text.strip(), SENTINEL_PORT
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(f"{text.strip()!r} is not host:port")
    return host.strip("[]"), int(port)


def kombu_url(address: SentinelAddress) -> str:
    """The same sentinels as kombu's broker URL (`sentinel://...;sentinel://...`, the master's
    password in each, its name in the transport options: kombu_options)."""
    auth = ""
    if address.password:
        auth = f"{address.username or ''}:{address.password}@"
    return ";".join(f"sentinel://{auth}{h}:{p}/{address.db}" for h, p in address.sentinels)


def kombu_options(address: SentinelAddress) -> dict[str, object]:
    """kombu's transport options for the sentinels: the master's name, the sentinels' login
    (a TLS broker behind sentinels takes Celery's own broker_use_ssl)."""
    options: dict[str, object] = {"master_name": address.master}
    if address.sentinel_kwargs:
        options["sentinel_kwargs"] = address.sentinel_kwargs
    return options
