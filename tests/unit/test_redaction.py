"""What a reader may see of a notification's receiver, and which hosts count as loopback for the
session cookie: pure functions, every shape of URL and Host header."""

from __future__ import annotations

import pytest

from fsm_celery.http.auth import loopback_host
from fsm_celery.records import definition_view, failure_kind, notification_view, redacted_url

URL = "https://user:pw@hooks.example.com:8443/T0/B1/secret?token=abc#frag"


@pytest.mark.parametrize(
    ("url", "host_only", "shown"),
    [
        (URL, True, "https://hooks.example.com:8443"),
        (URL, False, "https://***@hooks.example.com:8443/T0/B1/secret?***"),
        ("http://h.test/hook", False, "http://h.test/hook"),
        ("http://h.test/hook", True, "http://h.test"),
        ("http://token@h.test/", False, "http://***@h.test/"),
        ("http://[::1]:9/x?q", True, "http://[::1]:9"),
        ("http://h.test:99999/x", True, "***"),  # a port urllib refuses
        ("not a url", True, "***"),
        ("", False, "***"),
    ],
)
def test_a_url_is_shown_without_credentials_or_query(url: str, host_only: bool, shown: str) -> None:
    assert redacted_url(url, host_only=host_only) == shown


@pytest.mark.parametrize(
    ("error", "kind"),
    [
        ("HTTP 500: password=hunter2", "HTTP 500"),
        ("ConnectError: [Errno 111] Connection refused", "ConnectError"),
        (None, None),
        ("x" * 100, "x" * 40),
    ],
)
def test_a_failure_is_named_without_the_receivers_answer(error: str | None, kind: str) -> None:
    assert failure_kind(error) == kind


def test_a_notification_shows_the_answer_to_admins_only() -> None:
    row = {"id": 1, "url": URL, "last_error": "HTTP 500: secret", "status": "failed"}
    viewer, admin = (notification_view(row, admin=a) for a in (False, True))
    assert (viewer["url"], viewer["last_error"]) == ("https://hooks.example.com:8443", "HTTP 500")
    assert admin["last_error"] == "HTTP 500: secret" and "pw" not in admin["url"]
    assert row["url"] == URL  # the row itself is left as it was


def test_a_definitions_notify_url_is_shown_as_a_notifications() -> None:
    data = {"type": "t", "notify": {"url": URL, "on": ["failed"]}}
    shown = definition_view(data, admin=False)
    assert shown["notify"] == {"url": "https://hooks.example.com:8443", "on": ["failed"]}
    assert definition_view({"type": "t"}, admin=False) == {"type": "t"}


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1:8000", True),
        ("127.8.9.1", True),
        ("localhost:8000", True),
        ("LOCALHOST", True),
        ("[::1]:8000", True),
        ("dash.example.com", False),
        ("127.0.0.1.evil.example", False),
        ("localhost.evil.example", False),
        ("10.0.0.5:8000", False),
        ("", False),
        ("[::1", False),
        ("\x00", False),
    ],
)
def test_loopback_hosts(host: str, loopback: bool) -> None:
    assert loopback_host(host) is loopback
