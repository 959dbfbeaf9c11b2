"""A real HTTP receiver on 127.0.0.1 for the notifications' tests: it records what it is sent
and answers with the statuses it is given."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest


@dataclass
class Receiver:
    """An HTTP server that records what it is sent and answers with the statuses it is given."""

    answers: list[int] = field(default_factory=list)  # consumed in order; then 200
    received: list[tuple[dict[str, str], bytes]] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}/hook"


@contextmanager
def serve() -> Iterator[Receiver]:
    """A receiver serving on a free port of 127.0.0.1 until the block ends."""
    found = Receiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            data = self.rfile.read(int(self.headers["content-length"]))
            found.received.append(({k.lower(): v for k, v in self.headers.items()}, data))
            status = found.answers.pop(0) if found.answers else 200
            self.send_response(status)
            self.end_headers()
            self.wfile.write(b"nope" if status >= 300 else b"ok")

        def log_message(self, *_: Any) -> None:
            pass

    with serving(Handler) as found.server:
        yield found


@pytest.fixture
def receiver() -> Iterator[Receiver]:
    with serve() as found:
        yield found


@contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """An HTTP server of the handler on a free port of 127.0.0.1, on a thread of its own,
    until the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server
    finally:
        server.shutdown()
        server.server_close()
