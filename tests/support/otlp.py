"""A real OTLP/HTTP trace receiver on 127.0.0.1 for the traces' tests: what the processes'
exporters POST to /v1/traces (ExportTraceServiceRequest protobufs, as a collector takes them),
decoded with opentelemetry-proto and kept as plain spans."""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

from tests.support.receiver import serving


@dataclass(frozen=True)
class Span:
    """One span as it arrived: ids in hex, as W3C and trace viewers write them."""

    service: str
    name: str
    trace_id: str
    span_id: str
    parent_id: str  # "": a root span
    kind: int
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    error: bool
    links: tuple[str, ...]  # the span ids it links to


def _value(value: AnyValue) -> Any:
    which = value.WhichOneof("value")
    return getattr(value, which) if which is not None else None


def decode(body: bytes) -> list[Span]:
    """The spans of one export request."""
    request = ExportTraceServiceRequest()
    request.ParseFromString(body)
    found = []
    for resource_spans in request.resource_spans:
        resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
        for scope_spans in resource_spans.scope_spans:
            for span in scope_spans.spans:
                found.append(
                    Span(
                        service=str(resource.get("service.name", "")),
                        name=span.name,
                        trace_id=span.trace_id.hex(),
                        span_id=span.span_id.hex(),
                        parent_id=span.parent_span_id.hex(),
                        kind=span.kind,
                        start_ns=span.start_time_unix_nano,
                        end_ns=span.end_time_unix_nano,
                        attributes={a.key: _value(a.value) for a in span.attributes},
                        error=span.status.code == span.status.STATUS_CODE_ERROR,
                        links=tuple(link.span_id.hex() for link in span.links),
                    )
                )
    return found


@dataclass
class OtlpReceiver:
    """An OTLP/HTTP endpoint that keeps every span it is sent."""

    spans: list[Span] = field(default_factory=list)
    server: ThreadingHTTPServer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def endpoint(self) -> str:
        """OTEL_EXPORTER_OTLP_ENDPOINT's value (the exporter adds /v1/traces)."""
        assert self.server is not None
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def environment(self) -> dict[str, str]:
        """The OTEL_* that send a process's traces here, at once."""
        return {
            "OTEL_TRACES_EXPORTER": "otlp",
            "OTEL_EXPORTER_OTLP_ENDPOINT": self.endpoint,
            "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
            "OTEL_BSP_SCHEDULE_DELAY": "100",  # milliseconds between exports
            "OTEL_METRICS_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none",
        }

    def received(self) -> list[Span]:
        with self.lock:
            return list(self.spans)

    def wait_for(self, done: Callable[[list[Span]], bool], timeout: float = 30.0) -> list[Span]:
        """The spans received, once `done` holds of them (AssertionError past the timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.received()
            if done(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({f"{s.service}: {s.name}" for s in spans})
                raise AssertionError(f"{len(spans)} spans received, not the ones awaited: {names}")
            time.sleep(0.1)


@contextmanager
def serve() -> Iterator[OtlpReceiver]:
    """An OTLP receiver on a free port of 127.0.0.1 until the block ends."""
    found = OtlpReceiver()

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers["content-length"]))
            if self.headers.get("content-encoding") == "gzip":
                body = gzip.decompress(body)
            if self.path != "/v1/traces":
                self.send_response(404)
                self.end_headers()
                return
            spans = decode(body)
            with found.lock:
                found.spans.extend(spans)
            answer = ExportTraceServiceResponse().SerializeToString()
            self.send_response(200)
            self.send_header("content-type", "application/x-protobuf")
            self.send_header("content-length", str(len(answer)))
            self.end_headers()
            self.wfile.write(answer)

        def log_message(self, *_: Any) -> None:
            pass

    with serving(Handler) as found.server:
        yield found
