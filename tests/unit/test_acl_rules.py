"""The ACL rules an agent's Redis user gets, as text (tests/integration/test_acl.py and
test_acl_databases.py load them into a real Redis)."""

from __future__ import annotations

import uuid

import pytest

from fsm_celery.channel.acl import agent_acl_rules, new_password


def test_rules_refuse_unknown_optional_commands() -> None:
    with pytest.raises(ValueError, match=r"^optional commands: expected"):
        agent_acl_rules(uuid.uuid4(), "cto", "", new_password(), optional_commands=["flushall"])


def test_no_credentials_for_another_database_without_a_prefix() -> None:
    with pytest.raises(ValueError, match="database 3 needs an FSM_CHANNEL_PREFIX of its own"):
        agent_acl_rules(uuid.uuid4(), "cto", "", new_password(), database=3)
    assert "+select" not in agent_acl_rules(uuid.uuid4(), "cto", "", new_password())
    assert "+select" in agent_acl_rules(uuid.uuid4(), "cto", "d3:", new_password(), database=3)
