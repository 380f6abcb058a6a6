"""An OTLP/HTTP trace receiver on loopback that records what it got: every request's path and headers,
its body as sent (the bytes on the wire) and its spans, decoded from the protobuf."""

from __future__ import annotations

import gzip
import http.server
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


class Collector:
    """Every span posted to it, with the request's path and headers (names lower-cased)."""

    def __init__(self) -> None:
        self.spans: list[Any] = []
        self.paths: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.bodies: list[bytes] = []  # decompressed, as the exporter encoded them
        collector = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers["Content-Length"]))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest.FromString(body)
                collector.paths.append(self.path)
                collector.headers.append({k.lower(): v for k, v in self.headers.items()})
                collector.bodies.append(body)
                collector.spans += [s for r in request.resource_spans for ss in r.scope_spans for s in ss.spans]
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def api_keys(self) -> list[str | None]:
        return [h.get("x-api-key") for h in self.headers]

    def received(self) -> bytes:
        """Everything it was sent, headers and bodies, for looking for a secret in."""
        return repr(self.headers).encode() + b"".join(self.bodies)

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def collecting() -> Iterator[Collector]:
    receiver = Collector()
    try:
        yield receiver
    finally:
        receiver.close()


def attrs(span: Any) -> dict[str, Any]:
    return {a.key: _value(a.value) for a in span.attributes}


def _value(value: AnyValue) -> Any:
    return getattr(value, value.WhichOneof("value"))
