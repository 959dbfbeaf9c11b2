"""Where Redis is: a redis+sentinel:// URL read into the sentinels, the master's name, the
database and the logins; the same sentinels as kombu's broker URL; bad URLs refused saying
what is wrong (and never repeating the password)."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from fsm_celery.config import Settings
from fsm_celery.redis_address import is_sentinel, kombu_options, kombu_url, parse_sentinel


def test_a_sentinel_url_names_the_sentinels_the_master_and_the_logins() -> None:
    url = (
        "redis+sentinel://app:s%40cret@10.0.0.1:26379,10.0.0.2:26380,sentinel3/fsm/2"
        "?sentinel_password=watch"
    )
    found = parse_sentinel(url)
    assert found.sentinels == (("10.0.0.1", 26379), ("10.0.0.2", 26380), ("sentinel3", 26379))
    assert (found.master, found.db, found.username, found.password) == ("fsm", 2, "app", "s@cret")
    assert found.sentinel_kwargs == {"password": "watch"} and not found.tls
    assert is_sentinel(url) and not is_sentinel("redis://127.0.0.1:6379/0")
    assert parse_sentinel("rediss+sentinel://h:1/m?ssl_ca_certs=/ca.pem").tls_kwargs == {
        "ssl": True,
        "ssl_ca_certs": "/ca.pem",
    }


def test_kombu_reads_the_same_sentinels() -> None:
    found = parse_sentinel("redis+sentinel://:pw@h1:1,h2:2/fsm/3?sentinel_password=x")
    assert kombu_url(found) == "sentinel://:pw@h1:1/3;sentinel://:pw@h2:2/3"
    assert kombu_options(found) == {"master_name": "fsm", "sentinel_kwargs": {"password": "x"}}
    settings = Settings(redis_url="redis+sentinel://h1:1,h2:2/fsm", visibility_timeout_seconds=30)
    assert settings.celery_broker_url == "sentinel://h1:1/0;sentinel://h2:2/0"
    assert settings.celery_transport_options == {"visibility_timeout": 30, "master_name": "fsm"}
    plain = Settings(redis_url="redis://127.0.0.1:6379/1")
    assert plain.celery_broker_url == "redis://127.0.0.1:6379/1"
    assert plain.celery_transport_options == {"visibility_timeout": 60}


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+sentinel://h1:1,h2:2", "path is /MASTER or /MASTER/DB"),
        ("redis+sentinel://h1:1/m/x", "database number 'x'"),
        ("redis+sentinel:///m", "at least one sentinel"),
        ("redis+sentinel://h1:99999/m", "'h1:99999' is not host:port"),
        ("redis+sentinel://h1:1/m?master=x", "unknown option 'master'"),
        ("redis+sentinel://:hunter2@h1:1/m/1/2", "path is /MASTER or /MASTER/DB"),
    ],
)
def test_a_bad_sentinel_url_is_refused_saying_why(url: str, problem: str) -> None:
    with pytest.raises(ValidationError) as caught:
        Settings(redis_url=url)
    message = caught.value.errors()[0]["msg"]  # what fsm_celery.exits prints of it
    assert problem in message
    assert "hunter2" not in message


def test_an_agents_url_behind_sentinel_names_the_same_sentinels() -> None:
    from fsm_celery.channel.acl import database_of
    from fsm_celery.cli.agents import _agent_url

    url = "redis+sentinel://:engine@h1:1,h2:2/fsm/3?sentinel_password=x"
    assert _agent_url(url, "fsm-agent-7", "p@ss") == (
        "redis+sentinel://fsm-agent-7:p%40ss@h1:1,h2:2/fsm/3?sentinel_password=x"
    )
    assert database_of(url) == 3
