"""A signed outside event's signature (fsm_celery.core.signing): the HMAC-SHA256 of timestamp,
method, path and body under a machine type's secret, within a window of the server's clock."""

from __future__ import annotations

import hashlib
import hmac
from uuid import UUID

import pytest

from fsm_celery.core.signing import Signer, Unsigned, event_path, sign, signer_of

MID = UUID("3f2b8c1e-5d4a-4e8b-9c7d-2a1b0c9d8e7f")
PATH = event_path(MID, "pr_merged")
BODY = b'{"payload": {"merged": true}}'
SECRETS = {"cto_build_project": "b" * 40, "cto_fix_bug": "f" * 40}
NOW = 1_800_000_000


def _signer(header: str | None, stamp: str | None = str(NOW), path: str = PATH) -> object:
    return signer_of(SECRETS, header, stamp, ("POST", path, BODY), NOW, 300)


def test_the_signature_is_the_hmac_of_the_four_lines_the_docs_name() -> None:
    text = f"{NOW}\nPOST\n/api/machines/{MID}/events/pr_merged\n".encode() + BODY
    expected = hmac.new(b"f" * 40, text, hashlib.sha256).hexdigest()
    assert sign("f" * 40, str(NOW), "POST", PATH, BODY) == f"sha256={expected}"


def test_the_signer_is_the_type_whose_secret_signed() -> None:
    found = _signer(sign("f" * 40, str(NOW), "POST", PATH, BODY))
    assert isinstance(found, Signer) and found.identity == "signed:cto_fix_bug"


def test_another_machines_or_events_path_does_not_match() -> None:
    header = sign("f" * 40, str(NOW), "POST", PATH, BODY)
    other = event_path(UUID(int=1), "pr_merged")
    assert isinstance(_signer(header, path=other), Unsigned)
    assert isinstance(_signer(header, path=event_path(MID, "deployed")), Unsigned)


@pytest.mark.parametrize("stamp", [str(NOW - 301), str(NOW + 301), "", "12a", "9" * 13, None])
def test_a_timestamp_outside_the_window_or_not_a_number_is_refused(stamp: str | None) -> None:
    header = sign("f" * 40, stamp or "0", "POST", PATH, BODY)
    assert isinstance(_signer(header, stamp), Unsigned)


def test_a_timestamp_at_the_windows_edge_is_taken() -> None:
    stamp = str(NOW - 300)
    assert isinstance(_signer(sign("f" * 40, stamp, "POST", PATH, BODY), stamp), Signer)


def test_a_body_only_signature_and_a_missing_one_are_refused() -> None:
    body_only = hmac.new(b"f" * 40, BODY, hashlib.sha256).hexdigest()
    assert isinstance(_signer(f"sha256={body_only}"), Unsigned)
    assert isinstance(_signer(None), Unsigned)
    assert isinstance(_signer(body_only), Unsigned)  # without sha256=


def test_an_empty_secret_signs_nothing() -> None:
    found = signer_of(
        {"t": ""}, sign("", str(NOW), "POST", PATH, BODY), str(NOW), ("POST", PATH, BODY), NOW, 300
    )
    assert isinstance(found, Unsigned)
