"""Each deployment keeps its local state (beat's schedule, its processes' records) in a folder
of its own, even when deployments of one OS user share a host."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm_celery.config import Settings

SECRET = "k3v9Qx2LmZ8pW4rT6yB1nC5dF7gH0jKs"


@pytest.fixture(autouse=True)
def xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    monkeypatch.delenv("FSM_STATE_DIR", raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    return tmp_path


def _directory(**settings: str) -> Path:
    return Settings(task_token_secret=SECRET, **settings).state_directory  # type: ignore[arg-type]


def test_two_deployments_of_one_user_never_share_a_state_directory(xdg: Path) -> None:
    one = _directory(database_url="postgresql://ops:a-password@db:5432/billing")
    other = _directory(database_url="postgresql://ops:a-password@db:5432/support")
    same_db_other_prefix = _directory(
        database_url="postgresql://ops:a-password@db:5432/billing", channel_prefix="blue:"
    )
    assert len({one, other, same_db_other_prefix}) == 3
    assert one.parent == other.parent == xdg / "fsm-celery"
    assert one.name.startswith("billing-") and other.name.startswith("support-")


def test_a_deployment_finds_its_state_directory_again_whatever_its_password() -> None:
    # the digest is of the masked URLs: a rotated password keeps the folder (and no password is
    # digested into a name others may list)
    first = _directory(database_url="postgresql://ops:old-password@db:5432/billing")
    again = _directory(database_url="postgresql://ops:new-password@db:5432/billing")
    assert first == again


def test_fsm_state_dir_is_taken_as_it_is(tmp_path: Path) -> None:
    assert _directory(state_dir=str(tmp_path / "here")) == tmp_path / "here"
