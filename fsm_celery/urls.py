"""The URLs in the settings: checked for a kind fsm-celery can use (a ValueError saying what
is expected), and masked wherever they are shown."""

from __future__ import annotations

from typing import Annotated
from urllib.parse import urlsplit, urlunsplit

from pydantic import AfterValidator

from fsm_celery.redis_address import is_sentinel, parse_sentinel

REDIS_SCHEMES = ("redis", "rediss", "unix")
POSTGRES_SCHEMES = ("postgresql", "postgres", "postgresql+psycopg2")
AMQP_SCHEMES = ("amqp", "amqps", "pyamqp")  # RabbitMQ, as Celery's broker only


def database_url(url: str) -> str:
    """The URL with the installed driver: postgresql:// and postgres:// (what hosting
    providers and compose files give) become postgresql+psycopg2://, as SQLAlchemy 2.1 would
    otherwise reach for psycopg 3; sqlite:///PATH is the embedded mode."""
    scheme, sep, rest = url.partition("://")
    if sep and scheme in POSTGRES_SCHEMES:
        return "postgresql+psycopg2://" + rest
    if sep and scheme == "sqlite":
        return url
    raise ValueError(
        f"{mask(url)} is not a database URL fsm-celery can use: expected postgresql://"
        "user:password@host:port/database (or postgres://, postgresql+psycopg2://) or "
        "sqlite:///path"
    )


def redis_url(url: str, schemes: tuple[str, ...], name: str) -> str:
    """A Redis URL, plain or behind Sentinel (checked whole: ValueError saying what is wrong)."""
    if not is_sentinel(url):
        return _with_scheme(url, schemes, name)
    try:
        parse_sentinel(url)
    except ValueError as exc:
        raise ValueError(f"{mask(url)} is not a Sentinel URL {name} can use: {exc}") from None
    return url


def _with_scheme(url: str, schemes: tuple[str, ...], name: str) -> str:
    scheme, sep, _ = url.partition("://")
    if not sep or scheme not in schemes:
        expected = ", ".join(f"{s}://" for s in schemes)
        raise ValueError(f"{mask(url)} is not a URL {name} can use: expected {expected}")
    return url


def mask(url: str) -> str:
    """The URL with its password replaced by *** (each URL's, in a failover list of amqp://
    URLs separated by `;`, as Celery takes several RabbitMQ nodes)."""
    if is_amqp(url) and ";" in url:
        return ";".join(mask(part) for part in url.split(";"))
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.rsplit("@", 1)
    user = netloc[0].split(":", 1)[0]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{netloc[1]}"))


def _redis_url(url: str) -> str:
    return redis_url(url, REDIS_SCHEMES, "FSM_REDIS_URL")


def is_amqp(url: str) -> bool:
    """Whether a broker URL names RabbitMQ (amqp://, amqps://, pyamqp://)."""
    return url.partition("://")[0] in AMQP_SCHEMES


def _broker_url(url: str) -> str:
    if is_amqp(url):
        return url
    return redis_url(url, (*REDIS_SCHEMES, *AMQP_SCHEMES, "memory"), "FSM_BROKER_URL")


def _http_url(url: str) -> str:
    if url and not url.startswith(("http://", "https://")):
        raise ValueError(f"{mask(url)} is not an http:// or https:// URL")
    return url


# The settings' URL types, each checked for its kind as it is read
DatabaseUrl = Annotated[str, AfterValidator(database_url)]
RedisUrl = Annotated[str, AfterValidator(_redis_url)]
BrokerUrl = Annotated[str, AfterValidator(_broker_url)]
HttpUrlOrUnset = Annotated[str, AfterValidator(_http_url)]
