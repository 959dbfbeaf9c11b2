"""What a signed outside event's signature covers, and whether a request's signature is one of
the machine types' (pure).

The signer signs, under their machine type's secret (FSM_EVENT_SECRETS), the lines

    <timestamp>\\n<method>\\n<path>\\n<body>

the timestamp being X-FSM-Timestamp (Unix seconds), the method POST, the path
/api/machines/<machine id>/events/<event name>, and the body the bytes sent. So a signed request
acts on one machine, as one event, for a few minutes (FSM_EVENT_SIGNATURE_WINDOW_SECONDS): sent
to another machine of the type, as another event, or later, its signature no longer matches.
The identity recorded is the type whose secret signed it (`signed:<type>`), never a field.
"""

from __future__ import annotations

import hashlib
import hmac
import re
from collections.abc import Mapping
from dataclasses import dataclass
from uuid import UUID

PREFIX = "sha256="
TIMESTAMP = re.compile(r"^[0-9]{1,12}$")  # Unix seconds, bounded before any arithmetic


@dataclass(frozen=True)
class Signer:
    """The machine type whose secret signed a request, and the signature (its digest)."""

    machine_type: str
    digest: str

    @property
    def identity(self) -> str:
        """The sender recorded for what it sends."""
        return f"signed:{self.machine_type}"


@dataclass(frozen=True)
class Unsigned:
    """Why a request's signature is no machine type's: the one answer to every failure."""

    reason: str


def event_path(machine_id: UUID, name: str) -> str:
    """The path an event's signature covers: the machine's full id, lower case."""
    return f"/api/machines/{machine_id}/events/{name}"


def signed_text(timestamp: str, method: str, path: str, body: bytes) -> bytes:
    """The bytes a signer signs: timestamp, method and path, one a line, then the body."""
    return f"{timestamp}\n{method}\n{path}\n".encode() + body


def sign(secret: str, timestamp: str, method: str, path: str, body: bytes) -> str:
    """The X-FSM-Signature-256 header of a request (sha256=<hex>)."""
    text = signed_text(timestamp, method, path, body)
    return PREFIX + hmac.new(secret.encode(), text, hashlib.sha256).hexdigest()


def signer_of(
    secrets: Mapping[str, str],
    header: str | None,
    timestamp: str | None,
    text: tuple[str, str, bytes],
    now: float,
    window: int,
) -> Signer | Unsigned:
    """The machine type whose secret signed (method, path, body) at `timestamp`, within
    `window` seconds of now; or why none did. Every secret is tried, in constant time each, and
    nothing about any machine is read first: the answer is the same whether the machine exists
    or not."""
    if not header or not header.startswith(PREFIX):
        return Unsigned("X-FSM-Signature-256 (sha256=<hex>) is missing")
    if timestamp is None or TIMESTAMP.match(timestamp) is None:
        return Unsigned("X-FSM-Timestamp (Unix seconds) is missing or not a number")
    if abs(now - int(timestamp)) > window:
        return Unsigned(
            f"X-FSM-Timestamp is more than {window} s from the server's clock "
            "(FSM_EVENT_SIGNATURE_WINDOW_SECONDS)"
        )
    given = header.removeprefix(PREFIX).encode()
    found: Signer | None = None
    for machine_type, secret in secrets.items():
        if not secret:
            continue
        expected = sign(secret, timestamp, *text).removeprefix(PREFIX)
        if hmac.compare_digest(expected.encode(), given) and found is None:
            found = Signer(machine_type, expected)
    if found is None:
        return Unsigned(
            "X-FSM-Signature-256 is no machine type's signature of this timestamp, method, "
            "path and body"
        )
    return found
