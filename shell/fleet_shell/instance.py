"""One desktop window per FLEET_HOME: a second launch brings the running window to the front.

The first launch holds an OS lock on ``FLEET_HOME/desktop.lock`` (released by the OS when the
process ends, however it ends) and listens on a loopback port for a "focus" ping; the port and a
random secret go to ``FLEET_HOME/desktop.instance`` (0600, in the 0700 home). A second launch that
cannot take the lock reads that file, sends the secret, and exits. The secret keeps other local
programs from poking the window; all a ping can do is raise it.
"""

from __future__ import annotations

import hmac
import json
import os
import secrets
import socket
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

from fleet_rlm.config import private_dir

LOCK_NAME = "desktop.lock"
INFO_NAME = "desktop.instance"
PING = b"focus "
ACK = b"ok\n"


def _try_lock(handle: IO[bytes]) -> bool:
    """Take an exclusive, non-blocking lock on an open file; False when another process holds it."""
    try:
        if sys.platform == "win32":
            import msvcrt

            msvcrt.locking(handle.fileno(), msvcrt.LK_NBLCK, 1)
        else:
            import fcntl

            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        return False
    return True


def _write_private(path: Path, text: str) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.unlink(missing_ok=True)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(text)
    tmp.replace(path)


class Instance:
    """The running desktop's claim on FLEET_HOME. ``acquire()`` False: another one holds it."""

    def __init__(self, home: Path) -> None:
        self.home = private_dir(home)
        self._handle: IO[bytes] | None = None
        self._listener: socket.socket | None = None
        self._secret = secrets.token_urlsafe(24)

    def acquire(self) -> bool:
        fd = os.open(self.home / LOCK_NAME, os.O_RDWR | os.O_CREAT, 0o600)
        handle = os.fdopen(fd, "r+b")
        if not _try_lock(handle):
            handle.close()
            return False
        self._handle = handle
        return True

    def listen(self, on_focus: Callable[[], None]) -> None:
        """Answer focus pings (with this launch's secret) by calling ``on_focus``, in a daemon thread."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        sock.listen(4)
        self._listener = sock
        info = {"port": sock.getsockname()[1], "secret": self._secret, "pid": os.getpid()}
        _write_private(self.home / INFO_NAME, json.dumps(info))
        threading.Thread(target=self._serve, args=(sock, on_focus), name="fleet desktop: focus", daemon=True).start()

    def _serve(self, sock: socket.socket, on_focus: Callable[[], None]) -> None:
        expected = PING + self._secret.encode() + b"\n"
        while True:
            try:
                conn, _ = sock.accept()
            except OSError:  # closed by release()
                return
            with conn:
                conn.settimeout(2)
                try:
                    got = conn.recv(256)
                except OSError:
                    continue
                if hmac.compare_digest(got, expected):
                    on_focus()
                    conn.sendall(ACK)

    def release(self) -> None:
        if self._listener is not None:
            self._listener.close()
            (self.home / INFO_NAME).unlink(missing_ok=True)
        if self._handle is not None:
            self._handle.close()  # releases the lock


def focus_running(home: Path, timeout: float = 10.0) -> bool:
    """Ask the desktop that holds FLEET_HOME to raise its window. True when it answered.

    Waits up to ``timeout`` for a launch that is still starting to publish where it listens."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            info = json.loads((home / INFO_NAME).read_text())
            with socket.create_connection(("127.0.0.1", int(info["port"])), timeout=2) as conn:
                conn.sendall(PING + str(info["secret"]).encode() + b"\n")
                if conn.recv(16) == ACK:
                    return True
        except (OSError, ValueError, KeyError, TypeError):
            pass
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
