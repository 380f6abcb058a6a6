"""The REPL inside a Daytona interpreter context (stdlib only; uploaded beside ``worker.py``).

The host drives it with one ``run_code`` per request: ``__fleet.cell('<json message>')``, the same
messages ``worker.py`` takes (execute, configure, define_functions, set_var, put_text). Everything
the shim tells the host is a *frame* on the cell's stdout: a line starting with ``FRAME`` and
holding one JSON message (``output`` chunks while code runs, ``call`` for a host function, and the
reply, ``done``/``ok``/``error``, last). The user's own prints are captured by the worker and
travel inside those messages, so they can never be mistaken for frames.

Host calls (``llm_query``...) are bridged in-band: the shim prints a ``call`` frame and waits for
the host to upload the reply as a file in this context's private folder (``<dir>/<id>.reply``,
ending with ``REPLY_END`` so a half-written file is never read). No port, broker or key is needed
in the sandbox.
"""

from __future__ import annotations

import signal
import sys
import threading
from os import makedirs, unlink
from os.path import join
from time import sleep
from typing import Any

import fleet_worker as worker  # uploaded beside this file (sandbox/worker.py)

# As in worker.py: what this module's code uses can't be rebound by guest code (a private copy of
# the builtins, the functions above bound once, the worker's JSON coders).
globals()["__builtins__"] = dict(worker.PRISTINE_BUILTINS)

FRAME = "\x1efleet\x1f"
REPLY_END = b"\n\x04"
WRITE_CHUNK = 256 * 1024  # the daemon streams stdout in messages; keep each write well under its cap


class Shim(worker.Worker):
    """A ``worker.Worker`` whose transport is the cell's stdout plus reply files."""

    def __init__(self, folder: str, memory_mb: int) -> None:
        super().__init__(folder, memory_mb)
        self.folder = folder
        makedirs(folder, mode=0o700, exist_ok=True)
        self.out: Any = None
        self.out_lock = threading.Lock()
        try:  # SIGALRM needs the main thread; elsewhere the daemon's own timeout is the only one
            signal.signal(signal.SIGALRM, self._on_alarm)
            self.alarms = True
        except ValueError:
            self.alarms = False
        threading.Thread(target=self.streamer, name="fleet-stream", daemon=True).start()

    def send(self, message: dict[str, Any]) -> None:
        data = FRAME + worker.dumps(message) + "\n"
        with self.out_lock:
            out = self.out
            if out is None:  # no cell running: nobody to tell
                return
            for start in range(0, len(data), WRITE_CHUNK):
                out.write(data[start : start + WRITE_CHUNK])
            out.flush()

    def host_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call_id = next(self.call_ids)
        message = {"op": "call", "id": call_id, "name": name, "args": list(args), "kwargs": kwargs}
        size = len(worker.dumps(message).encode("utf-8", "surrogatepass"))
        if size > worker.MAX_MESSAGE:
            raise ValueError(
                f"{name}: the arguments are {size >> 20} MB, over the {worker.MAX_MESSAGE >> 20} MB limit of one "
                "call; pass smaller pieces (slice the text, or batch fewer prompts per call)"
            )
        path = join(self.folder, f"{call_id}.reply")
        self.send(message)
        delay = 0.002
        while True:  # short sleeps keep the main thread responsive to the SIGALRM timeout
            try:
                with open(path, "rb") as fh:
                    data = fh.read()
            except FileNotFoundError:
                data = b""
            if data.endswith(REPLY_END):
                unlink(path)
                break
            sleep(delay)
            delay = min(delay * 1.5, 0.05)
        reply = worker.loads(data[: -len(REPLY_END)].decode("utf-8", "surrogatepass"))
        if not reply.get("ok"):
            raise RuntimeError(reply.get("error") or f"{name} failed")
        return reply.get("value")

    def cell(self, text: str) -> None:
        """One request from the host; its reply is the cell's last frame."""
        message = worker.loads(text)
        if message.get("op") == "execute" and not self.alarms:
            message["timeout"] = None
        if message.get("op") in ("put_text", "put_file"):  # uploaded as a file: read it, then drop the file
            path = join(self.folder, "input")
            with open(path, "rb") as fh:
                message["blob"] = fh.read()
            unlink(path)
        with self.out_lock:
            self.out = sys.stdout
        try:
            try:
                reply = self.handle(message)
            except BaseException as exc:  # the reply must always come
                reply = {"op": "error", "id": message.get("id"), "error": f"{type(exc).__name__}: {exc}"}
            self.send(reply)
        finally:
            with self.out_lock:
                self.out = None
