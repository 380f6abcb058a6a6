"""One interpreter context of the Daytona API double: a persistent Python namespace (stdlib only).

The double (tests/support/daytona_api.py) starts one of these per context, inside the sandbox's
bubblewrap view, and writes one JSON request per line on stdin: ``{"code": ...}``. While the code
runs in the main thread, everything it prints is sent at once as ``{"type": "stdout"|"stderr",
"text"}`` lines on the protocol fd; an uncaught exception becomes ``{"type": "error", name, value,
traceback}``; ``{"type": "done"}`` ends the cell. SIGINT (the double's timeout) interrupts it.
"""

from __future__ import annotations

import io
import json
import os
import signal
import sys
import threading
import traceback


class _Forward(io.TextIOBase):
    """sys.stdout/err during a cell: every write goes out as one message, from any thread."""

    def __init__(self, kind: str, send: object) -> None:
        self.kind = kind
        self.send = send

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            self.send({"type": self.kind, "text": text})
        return len(text)


def main() -> None:
    proto = os.fdopen(os.dup(1), "w", encoding="utf-8", buffering=1)
    os.dup2(2, 1)  # stray fd-1 writes (C code) must not corrupt the protocol
    lock = threading.Lock()

    def send(message: dict) -> None:
        line = json.dumps(message) + "\n"
        with lock:
            proto.write(line)
            proto.flush()

    namespace: dict = {"__name__": "__main__"}
    sys.stdout = _Forward("stdout", send)
    sys.stderr = _Forward("stderr", send)
    running = threading.Event()

    def interrupt(signum: int, frame: object) -> None:
        if running.is_set():  # between cells a late SIGINT must not kill the context
            raise KeyboardInterrupt

    signal.signal(signal.SIGINT, interrupt)
    send({"type": "ready", "pid": os.getpid()})  # the double interrupts this process, not bubblewrap
    for line in sys.stdin:
        request = json.loads(line)
        running.set()
        try:
            exec(compile(request["code"], "<cell>", "exec"), namespace)
        except BaseException as exc:  # a cell's errors are reported, never fatal
            send({
                "type": "error", "name": type(exc).__name__, "value": str(exc),
                "traceback": "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)),
            })  # fmt: skip
        running.clear()
        send({"type": "done"})


if __name__ == "__main__":
    main()
