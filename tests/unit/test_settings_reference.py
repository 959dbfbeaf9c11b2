"""README's configuration table is the settings class's, and URLs get the installed driver."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from pydantic import ValidationError

from fsm_celery.config import Settings
from fsm_celery.settings_reference import descriptions, settings_reference
from fsm_celery.urls import mask

README = Path(__file__).resolve().parents[2] / "README.md"


def test_the_readme_lists_every_setting_as_the_code_defines_it() -> None:
    text = README.read_text()
    block = text.split("<!-- settings:begin -->\n", 1)[1].split("<!-- settings:end -->", 1)[0]
    assert block == settings_reference(), "README's settings differ: run `make docs`"
    for name in Settings.model_fields:
        assert f"`FSM_{name.upper()}`" in block
        assert descriptions().get(name), f"{name} has no description (a docstring under it)"


@pytest.mark.parametrize(
    ("given", "used"),
    [
        ("postgresql://u:p@db:5432/fsm", "postgresql+psycopg2://u:p@db:5432/fsm"),
        ("postgres://u:p@db/fsm", "postgresql+psycopg2://u:p@db/fsm"),
        ("postgresql+psycopg2://u@db/fsm", "postgresql+psycopg2://u@db/fsm"),
        ("sqlite:////tmp/fsm.sqlite3", "sqlite:////tmp/fsm.sqlite3"),
    ],
)
def test_database_urls_use_the_installed_driver(given: str, used: str) -> None:
    assert Settings(database_url=given).database_url == used


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("database_url", "not a url", "expected postgresql://"),
        ("database_url", "mysql://u:hunter2@db/x", "mysql://u:***@db/x is not a database URL"),
        ("redis_url", "http://127.0.0.1:6379", "expected redis://, rediss://, unix://"),
        ("broker_url", "http://guest@rabbit//", "FSM_BROKER_URL"),
    ],
)
def test_a_url_of_the_wrong_kind_is_refused_with_what_is_expected(
    field: str, value: str, message: str
) -> None:
    with pytest.raises(ValidationError, match=re.escape(message)) as caught:
        Settings(**{field: value})
    assert "hunter2" not in caught.value.errors()[0]["msg"]


def test_mask_hides_only_the_password() -> None:
    assert mask("rediss://fsm:s3cret@cache:6380/2") == "rediss://fsm:***@cache:6380/2"
    assert mask("redis://cache:6379/0") == "redis://cache:6379/0"


@pytest.mark.parametrize("url", ["amqp://fsm:pw@rabbit:5672/fsm", "amqps://fsm:pw@rabbit/fsm"])
def test_rabbitmq_is_a_broker_url_and_redis_stays_the_agents(url: str) -> None:
    settings = Settings(broker_url=url, redis_url="redis://cache:6379/0")
    assert settings.celery_broker_url == url
    assert settings.broker_is_amqp
    assert settings.redis_url == "redis://cache:6379/0"
    with pytest.raises(ValidationError, match="expected redis://"):
        Settings(redis_url=url)  # the agents' channel is Redis only


def test_a_failover_list_of_rabbitmq_nodes_is_a_broker_url_masked_node_by_node() -> None:
    nodes = ";".join(f"amqp://fsm:hunter2@rabbit{n}:5672/fsm" for n in (1, 2, 3))
    settings = Settings(broker_url=nodes)
    assert settings.broker_is_amqp
    assert settings.celery_broker_url == nodes
    assert mask(nodes) == ";".join(f"amqp://fsm:***@rabbit{n}:5672/fsm" for n in (1, 2, 3))
