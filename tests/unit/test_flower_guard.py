"""Which Flower options may serve, and on which address (pure: no Flower started)."""

from __future__ import annotations

import pytest

from fsm_celery.exceptions import InsecureFlower
from fsm_celery.worker.flower import checked_address


def test_basic_auth_serves_where_asked() -> None:
    assert checked_address(["ops:secret"], "", "0.0.0.0", False) == "0.0.0.0"
    assert checked_address(["ops:secret", "dev:other"], "", "", False) == ""


def test_oauth_serves_where_asked() -> None:
    assert checked_address(None, "*@example.com", "10.0.0.5", False) == "10.0.0.5"


@pytest.mark.parametrize("entry", ["ops", "ops:", ":secret", ""])
def test_a_basic_auth_entry_without_user_or_password_is_refused(entry: str) -> None:
    with pytest.raises(InsecureFlower, match="user:password"):
        checked_address(["ops:secret", entry], "", "", False)


def test_no_credentials_is_refused() -> None:
    with pytest.raises(InsecureFlower, match="FLOWER_BASIC_AUTH"):
        checked_address(None, "", "127.0.0.1", False)


def test_unauthenticated_serves_loopback_only() -> None:
    assert checked_address(None, "", "", True) == "127.0.0.1"  # not every interface
    assert checked_address([], "", "::1", True) == "::1"
    with pytest.raises(InsecureFlower, match=r"127\.0\.0\.1 only"):
        checked_address(None, "", "0.0.0.0", True)
