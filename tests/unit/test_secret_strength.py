"""Secrets: what someone typed is refused, what a generator made is never refused."""

from __future__ import annotations

import secrets

import pytest

from fsm_celery.config import Settings
from fsm_celery.secret_strength import weak_secret


@pytest.mark.parametrize(
    "generate",
    [
        lambda: secrets.token_hex(16),  # 32 characters of 16: the shortest accepted
        lambda: secrets.token_hex(32),
        lambda: secrets.token_urlsafe(32),
        lambda: secrets.token_urlsafe(24),
    ],
)
def test_a_generated_secret_is_never_refused(generate: object) -> None:
    assert callable(generate)
    refused = [s for s in (generate() for _ in range(5_000)) if weak_secret(s, 32)]
    assert refused == []


@pytest.mark.parametrize(
    ("secret", "says"),
    [
        ("z" * 32, "fewer than 8 different characters"),
        ("passwordpasswordpasswordpassword", "fewer than 8 different characters"),
        ("0123456" * 5, "fewer than 8 different characters"),
        ("test-admin-token-" + "a" * 32, "more than half one character"),
        ("x" * 31, "shorter than 32 bytes"),
        ("12345678" * 4, "repeats a shorter pattern"),
        ("Password1" * 4, "repeats a shorter pattern"),
        ("Password1Password2Password3Password4", "repeats a shorter pattern"),
        ("0123456789abcdefghijklmnopqrstuv", "steps through a sequence"),
        ("zyxwvutsrqponmlkjihgfedcba9876543210", "steps through a sequence"),
    ],
)
def test_a_typed_pattern_is_refused(secret: str, says: str) -> None:
    problem = weak_secret(secret, 32)
    assert problem is not None and says in problem


def test_a_short_notification_secret_is_refused() -> None:
    settings = Settings(
        task_token_secret="k3v9Qx2LmZ8pW4rT6yB1nC5dF7gH0jKs", notify_secret="k3v9Qx2LmZ8p"
    )
    assert settings.secret_problem() == "FSM_NOTIFY_SECRET is shorter than 32 bytes"


def test_the_first_secret_signs_and_every_one_is_accepted() -> None:
    new, old = secrets.token_hex(32), secrets.token_urlsafe(32)
    settings = Settings(task_token_secret=f"{new}, {old}")
    assert settings.token_secrets == (new, old)
    assert settings.secret_problem() is None
