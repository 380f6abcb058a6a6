"""An ASGI app served by uvicorn in a thread on a free loopback port, for tests that need a real socket
(SSE streams, Streamable HTTP): httpx's ASGITransport buffers whole bodies and checks no Host header."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import uvicorn


@contextmanager
def serve_asgi(app_for_port: Callable[[int], Any], start_timeout: float = 30) -> Iterator[str]:
    """Serve the app ``app_for_port(port)`` builds (apps that check their Host need the port) until the
    block ends; yields its base URL ``http://127.0.0.1:PORT``."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(app_for_port(port), log_level="warning", lifespan="on"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + start_timeout
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(30)
        sock.close()
