"""Run a console script on a pseudo-terminal, as a person at a keyboard would (tests only)."""

from __future__ import annotations

import os
import pty
import select
import subprocess
import sys
import time
from pathlib import Path

BIN = Path(sys.executable).parent


class Terminal:
    """A console script on a pseudo-terminal: what a person at a keyboard sees."""

    def __init__(self, prog: str, *args: str, env: dict[str, str]) -> None:
        self.master, slave = pty.openpty()
        self.proc = subprocess.Popen(
            [str(BIN / prog), *args], stdin=slave, stdout=slave, stderr=slave, env={**os.environ, **env},
            close_fds=True,
        )  # fmt: skip
        os.close(slave)
        self.seen = ""

    def expect(self, text: str, timeout: float = 90, after: int = 0) -> None:
        """Wait until ``text`` appears on the screen (after position ``after``)."""
        deadline = time.monotonic() + timeout
        while text not in self.seen[after:]:
            left = deadline - time.monotonic()
            assert left > 0, f"never saw {text!r}; screen so far:\n{self.seen[-2000:]}"
            ready, _, _ = select.select([self.master], [], [], min(left, 0.5))
            if ready:
                try:
                    self.seen += os.read(self.master, 65536).decode(errors="replace")
                except OSError:  # the process closed the terminal
                    assert text in self.seen[after:], f"exited before {text!r}:\n{self.seen[-2000:]}"

    def type(self, line: str) -> None:
        os.write(self.master, (line + "\n").encode())

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=30)
        os.close(self.master)
