"""The HTTP plumbing the scripted model servers share (oracle_lm, agent_lm): a threaded server on a free
127.0.0.1 port run in a daemon thread by a context manager, and a quiet handler that answers JSON.

Each server supplies only its handler class (a ``QuietHandler`` subclass) and what it records."""

from __future__ import annotations

import json
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Self


class _Server(ThreadingHTTPServer):
    request_queue_size = 512  # the default backlog of 5 resets connections under fan-out
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError):  # a client that hung up (rlms drops its pool)
            return
        super().handle_error(request, client_address)


class QuietHandler(BaseHTTPRequestHandler):
    """A keep-alive handler that logs nothing and sends a JSON response in one send."""

    protocol_version = "HTTP/1.1"
    # Headers and body leave in one send (the buffer is flushed after each request), and
    # Nagle is off: a response written in two sends on a kept-alive connection otherwise
    # waits ~40 ms for the client's delayed ACK, which would swamp every timing. A streamed
    # response flushes each event itself.
    wbufsize = 1 << 16
    disable_nagle_algorithm = True

    def log_message(self, *args: object) -> None:  # keep test output quiet
        return

    def send_json(self, status: int, payload: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)


class LoopbackServer:
    """Serves ``handler`` on a free loopback port while in ``with``; ``base_url`` ends in ``/v1``."""

    def __init__(self, handler: type[BaseHTTPRequestHandler]) -> None:
        self._server = _Server(("127.0.0.1", 0), handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
