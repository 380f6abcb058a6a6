"""The frames of one Daytona request, parsed out of the context's streamed stdout (see
``daytona_shim``): output chunks, host calls and the reply. Everything here is hostile input:
lines are size-bounded, frames depth-checked and matched against the request in flight, and any
violation stops the stream (``ProtocolViolation``) before the SDK can buffer more of it."""

from __future__ import annotations

import json
import logging
import sys
from collections.abc import Callable
from typing import Any

from fleet_rlm.sandbox.base import MAX_DEPTH, MAX_MESSAGE_BYTES, ProtocolViolation, nesting_depth

log = logging.getLogger(__name__)
FRAME = "\x1efleet\x1f"  # keep in step with daytona_shim.FRAME
MAX_HOST_CALLS = 1024  # host calls one request may have outstanding
MAX_STRAY = 1 << 20  # non-frame stdout accepted per request (the context's own noise), then refused


class Frames:
    """Parses the frames of one request out of the streamed stdout, trusting none of them."""

    def __init__(self, box: Any, request: dict[str, Any], on_output: Callable[[str], None] | None) -> None:
        self.box = box
        self.request = request
        self.on_output = on_output
        self.buffer: list[str] = []
        self.buffered = 0
        self.stray = 0
        self.streamed = 0
        self.reply: dict[str, Any] | None = None
        self.started = False  # anything arrived: the code was surely sent
        self.violation: ProtocolViolation | None = None
        self.calls: set[int] = set()
        self.seen_calls: set[int] = set()

    def stderr(self, message: Any) -> None:
        self.started = True
        log.debug("daytona context stderr: %s", str(getattr(message, "output", ""))[:2000])

    def feed(self, message: Any) -> None:
        """SDK callback per stdout chunk; raising stops the run (a hostile flood never reaches memory)."""
        self.started = True
        text = getattr(message, "output", "")
        if not isinstance(text, str):
            return
        while text:
            cut = text.find("\n")
            piece, text = (text, "") if cut < 0 else (text[: cut + 1], text[cut + 1 :])
            self.buffer.append(piece)
            self.buffered += len(piece)
            if self.buffered > MAX_MESSAGE_BYTES + 65536:
                self._violate(f"a message over the {MAX_MESSAGE_BYTES >> 20} MB limit")
            if cut >= 0:
                line, self.buffer, self.buffered = "".join(self.buffer), [], 0
                self._line(line)

    def _violate(self, why: str) -> None:
        self.violation = ProtocolViolation(why)
        raise self.violation

    def _line(self, line: str) -> None:
        if not line.startswith(FRAME):
            self.stray += len(line)
            if self.stray > MAX_STRAY:
                self._violate("too much output outside the protocol")
            return
        try:
            frame = json.loads(line[len(FRAME) :])
        except (ValueError, RecursionError):
            self._violate(f"a frame that is not JSON: {line[:100]!r}")
        if not isinstance(frame, dict) or not isinstance(frame.get("op"), str) or nesting_depth(frame) > MAX_DEPTH:
            self._violate("a malformed frame")
        if self.reply is not None:
            self._violate("a frame after the reply")
        op, execute = frame["op"], self.request["op"] == "execute"
        if op == "call":
            self._call(frame, execute, sys.getsizeof(line))  # what it takes on the host: wide characters count
        elif frame.get("id") != self.request["id"]:
            self._violate(f"a {op[:20]!r} frame for another request")
        elif op == "output":
            data = frame.get("data")
            if not execute or not isinstance(data, str):
                self._violate("output outside a running step")
            room = self.box.output_limit - self.streamed
            if room > 0 and self.on_output is not None:
                self.streamed += min(room, len(data))
                try:
                    self.on_output(data[:room])
                except Exception:
                    log.exception("on_output callback failed")
        elif op in ("done", "ok", "error"):
            if (op == "done") != execute:
                self._violate(f"a {op!r} reply to a {self.request['op']} request")
            self.reply = frame
        else:
            self._violate(f"unknown frame op {op[:40]!r}")

    def _call(self, frame: dict[str, Any], execute: bool, size: int) -> None:
        call_id, name = frame.get("id"), frame.get("name")
        args, kwargs = frame.get("args", []), frame.get("kwargs", {})
        if not (isinstance(call_id, int) and isinstance(name, str) and isinstance(args, list)):
            self._violate("a malformed host call")
        if not isinstance(kwargs, dict) or call_id in self.seen_calls or not execute:
            self._violate(f"a malformed, repeated or misplaced host call (id {call_id})")
        if len(self.calls) >= MAX_HOST_CALLS:
            self._violate(f"over {MAX_HOST_CALLS} host calls at once")
        self.seen_calls.add(call_id)
        self.box.start_host_call(call_id, name, args, kwargs, size, self.calls)

    async def settle(self) -> None:
        """Wait for replies still being uploaded (their step has ended; they are moot but harmless)."""
        await self.box.settle_replies(timeout=5)
