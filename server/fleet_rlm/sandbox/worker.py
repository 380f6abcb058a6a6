"""In-sandbox REPL worker for fleet-rlm (stdlib only).

Run as ``python3 -I -S -u worker.py --workdir DIR --memory-mb N --max-procs N``, possibly
inside bubblewrap where nothing but the standard library exists.

Protocol: newline-delimited JSON objects (UTF-8). A message with ``"blob": N`` is followed by
exactly N raw bytes (how big inputs travel: no file paths cross the boundary).
Host -> worker (every request carries ``id``; only ``execute`` replies ``done``):
  execute {code, timeout, output_limit} -> done {stdout, value, data, error, error_kind, final, duration}
      plus throttled {"op":"output","id","data"} chunks while the code runs.
  configure {output_fields}, define_functions {names}, set_var {name, value},
  put_text {name, blob}                   -> {"op":"ok","id"} or {"op":"error","id","error"}
  put_file {path, blob}                   -> the same; ``path`` is relative to the work folder
  append_var {name, value}                -> the same; appends to the list bound to ``name``
  result {id, ok, value | error}          -> answer to a host call (no reply)
  shutdown                                -> worker exits (EOF on stdin as well)
Worker -> host: ready {pid} once at start; call {id, name, args, kwargs} for host functions. Bytes
in a call's arguments (an image the code made, for ``llm_query(prompt, images=[...])``) cross as
``{"__fleet_bytes__": "<base64>"}``, in lists and dicts too (``_wire``).
No message may exceed MAX_MESSAGE bytes: the host stops a worker that sends one.
A request the worker cannot read, or a reply it cannot send, ends it at once (exit code 70, the
reason on stderr): the host would otherwise wait out the step's time limit for a reply.
"""

from __future__ import annotations

import argparse
import builtins
import io
import itertools
import os
import sys
import threading
import types
import weakref
from ast import Expr, Expression, parse
from binascii import b2a_base64
from collections import deque
from collections.abc import Callable
from json import JSONDecoder, JSONEncoder
from json import encoder as json_encoder
from json.encoder import encode_basestring, encode_basestring_ascii
from queue import Empty, SimpleQueue
from signal import ITIMER_REAL, SIGALRM, setitimer
from signal import signal as set_handler
from time import monotonic, sleep
from traceback import format_exception_only
from types import SimpleNamespace
from typing import Any, NoReturn

# ---- the worker's own names, out of the guest code's reach -------------------------------------
# Guest code may rebind anything it can reach: `SUBMIT = None`, `import builtins; builtins.len = None`,
# `import json; json.dumps = None`. None of it may break the REPL itself, so:
# - what the protocol uses of other modules is bound here, once, before any guest code runs (the
#   `from ... import` lines above, and the JSON coders below);
# - every function of this module resolves builtins in a private copy: CPython finds a function's
#   builtins through its module's ``__builtins__`` (bound when the ``def`` runs, since 3.10), so
#   setting it here, before the first ``def``, keeps `len`, `repr`, `isinstance`... of the worker's
#   own code out of reach (daytona_shim.py does the same);
# - guest code gets a builtins module of its own (``import builtins`` in it returns that one), and
#   before every step that copy, the real module and the host-provided names (SUBMIT, the host
#   functions) are put back as they were (Worker.execute).
PRISTINE_BUILTINS: dict[str, Any] = dict(vars(builtins))
REAL_BUILTINS: dict[str, Any] = vars(builtins)
REAL_IMPORT = builtins.__import__
globals()["__builtins__"] = dict(PRISTINE_BUILTINS)


def _not_json(value: Any) -> Any:
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def _json_encoder(*, ascii_only: bool, allow_nan: bool, default: Callable[[Any], Any]) -> Callable[[Any], str]:
    """``json.dumps`` with these options, bound now: the C encoder alone where CPython has it (the
    stdlib's Python layer around it looks up ``isinstance`` in the real builtins, which a step can reach)."""
    make: Any = getattr(json_encoder, "c_make_encoder", None)
    if make is None:
        return JSONEncoder(ensure_ascii=ascii_only, allow_nan=allow_nan, default=default).encode
    strings = encode_basestring_ascii if ascii_only else encode_basestring

    def encode(value: Any) -> str:
        return "".join(make({}, default, strings, None, ": ", ", ", False, False, allow_nan)(value, 0))

    return encode


dumps = _json_encoder(ascii_only=False, allow_nan=True, default=str)  # the protocol's (json.dumps(default=str))
_dumps_data = _json_encoder(ascii_only=True, allow_nan=False, default=_not_json)  # _plain's strict check
_scan = JSONDecoder().scan_once  # type: ignore[attr-defined]  # its scanner (C in CPython), alone: see loads
_write = os.write
_exit = os._exit

MAX_MESSAGE = 64 * 1024 * 1024  # keep in step with fleet_rlm.sandbox.base.MAX_MESSAGE_BYTES
PLAIN_DATA_CHARS = 100_000  # trailing values up to this size (as JSON) also travel as data
STREAM_INTERVAL = 0.2  # seconds between live output chunks
REPL_FILENAME = "<repl>"
RESERVED = frozenset({"SUBMIT", "__builtins__"})  # no host function or variable may take these
# A host function's error the REPL raises as its own type ("error_type" of a call's result, base.py);
# any other is a RuntimeError carrying the message.
HOST_ERRORS: dict[Any, type[Exception]] = {"PermissionError": PermissionError, "TimeoutError": TimeoutError}
BYTES_TAG = "__fleet_bytes__"  # keep in step with fleet_rlm.sandbox.base.BYTES_TAG
WIRE_DEPTH = 8  # how deep in a call's lists and dicts bytes are looked for (images=[[png, ...], ...] is 3)


class _Submit(BaseException):
    """Raised by SUBMIT; BaseException so user `except Exception` blocks don't swallow it."""

    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__("SUBMIT")
        self.payload = payload


class _Timeout(BaseException):
    """Raised in the main thread by SIGALRM when an execution exceeds its time limit."""


class _Capture:
    """Bounded head+tail buffer shared by the stdout/stderr replacements of one execution."""

    def __init__(self, limit: int) -> None:
        self.lock = threading.Lock()
        self.limit = limit
        self.head_limit = limit // 2
        self.tail_limit = limit - self.head_limit
        self.head: list[str] = []
        self.head_len = 0
        self.tail: deque[str] = deque()
        self.tail_len = 0
        self.dropped = 0
        self.pending: list[str] = []  # written but not yet streamed to the host
        self.streamed = 0
        self.err_line_start = True

    def add(self, text: str) -> None:
        with self.lock:
            # Live streaming is capped too, so a print loop cannot flood the pipe.
            room = self.limit - self.streamed
            if room > 0:
                chunk = text[:room]
                self.pending.append(chunk)
                self.streamed += len(chunk)
            room = self.head_limit - self.head_len
            if room > 0:
                self.head.append(text[:room])
                self.head_len += min(room, len(text))
                text = text[room:]
            if not text:
                return
            self.tail.append(text)
            self.tail_len += len(text)
            while self.tail_len > self.tail_limit:
                cut = min(len(self.tail[0]), self.tail_len - self.tail_limit)
                if cut == len(self.tail[0]):
                    self.tail.popleft()
                else:
                    self.tail[0] = self.tail[0][cut:]
                self.tail_len -= cut
                self.dropped += cut

    def take_pending(self) -> str:
        with self.lock:
            data = "".join(self.pending)
            self.pending.clear()
            return data

    def text(self) -> str:
        with self.lock:
            head, tail = "".join(self.head), "".join(self.tail)
        if not self.dropped:
            return head + tail
        return f"{head}\n... [{self.dropped} characters of output omitted] ...\n{tail}"


class _Stream(io.TextIOBase):
    """File-like replacement for sys.stdout / sys.stderr during an execution."""

    def __init__(self, capture: _Capture, is_err: bool) -> None:
        self._capture = capture
        self._is_err = is_err

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return "utf-8"

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        out = text
        if self._is_err and text:
            # Mark every stderr line so the reader can tell it from normal prints.
            cap = self._capture
            lines = text.split("\n")
            parts = []
            for i, line in enumerate(lines):
                if i > 0:
                    parts.append("\n")
                    cap.err_line_start = True
                if line:
                    if cap.err_line_start:
                        parts.append("[stderr] ")
                    parts.append(line)
                    cap.err_line_start = False
            out = "".join(parts)
        self._capture.add(out)
        return len(text)


class Worker:
    def __init__(self, workdir: str, memory_mb: int) -> None:
        self.workdir = workdir
        self.memory_mb = memory_mb
        # User code lives in a fresh module registered as __main__, so dataclasses and pickle of
        # user-defined classes resolve their module (the worker's own globals stay apart).
        main_module = types.ModuleType("__main__")
        sys.modules["__main__"] = main_module
        self.namespace: dict[str, Any] = main_module.__dict__
        # The guest's own builtins module; `import builtins` in guest code returns it (see _import).
        self.guest_builtins = types.ModuleType("builtins")
        # Names the REPL provides (SUBMIT, the host functions): put back before every step.
        self.owned: dict[str, Any] = {}
        # Host functions named "server.tool" (an MCP server's tools): each server is a namespace
        # object, made afresh before every step so guest code cannot keep one it changed.
        self.spaces: dict[str, dict[str, Any]] = {}
        self.output_fields: list[dict[str, Any]] | None = None
        self.requests: SimpleQueue[dict[str, Any] | None] = SimpleQueue()
        self.outgoing: SimpleQueue[bytes | None] = SimpleQueue()
        self.calls: dict[int, SimpleQueue[dict[str, Any]]] = {}
        self.call_ids = itertools.count(1)
        self.closed = threading.Event()
        self.capture: _Capture | None = None
        self.capture_id: Any = None
        # Held while output is taken and queued, so no chunk can follow its step's "done".
        self.stream_lock = threading.Lock()
        self.armed = False
        self.sources: weakref.WeakKeyDictionary[types.CodeType, list[str]] = weakref.WeakKeyDictionary()
        self.owned["SUBMIT"] = self._submit
        self.reset_names()

    # ---- transport -------------------------------------------------------------------------------
    def send(self, message: dict[str, Any]) -> None:
        # Only the writer thread touches the fd; SimpleQueue.put is atomic for signal handlers,
        # so a SIGALRM can never leave a half-written line on the protocol pipe.
        self.outgoing.put(_encode(message))

    def writer(self, fd: int) -> None:
        while True:
            data = self.outgoing.get()
            if data is None:
                return
            try:
                view = memoryview(data)
                while view:
                    view = view[_write(fd, view) :]
            except OSError:
                self.closed.set()
                return

    def reader(self) -> None:
        stdin = sys.stdin.buffer
        while True:
            line = stdin.readline()
            if not line:
                break
            try:
                message = loads(line.decode("utf-8", "surrogatepass"))
                size = message.get("blob")
                if size is not None:
                    message["blob"] = stdin.read(size)
            except BaseException as exc:  # the host waits for a reply that can never come: end it now
                _fatal(f"reading the request {line[:200]!r}", exc)
            if message.get("op") == "result":
                slot = self.calls.get(message.get("id"))
                if slot is not None:  # a call abandoned after a timeout has no slot any more
                    slot.put(message)
                continue
            self.requests.put(message)
            if message.get("op") == "shutdown":
                break
        self.closed.set()
        self.requests.put(None)

    def streamer(self) -> None:
        while not self.closed.is_set():
            sleep(STREAM_INTERVAL)
            with self.stream_lock:
                capture, req_id = self.capture, self.capture_id
                data = capture.take_pending() if capture is not None else ""
                if data:
                    # Not contextlib.suppress: it calls issubclass from the builtins a step can break.
                    try:  # noqa: SIM105
                        self.send({"op": "output", "id": req_id, "data": data})
                    except Exception:  # the step broke what encoding uses (put back after it); the reply has it all
                        pass

    # ---- host calls ------------------------------------------------------------------------------
    def host_call(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        call_id = next(self.call_ids)
        slot: SimpleQueue[dict[str, Any]] = SimpleQueue()
        self.calls[call_id] = slot
        try:
            line = _encode({"op": "call", "id": call_id, "name": name, "args": list(args), "kwargs": kwargs})
            if len(line) > MAX_MESSAGE:
                raise ValueError(
                    f"{name}: the arguments are {len(line) >> 20} MB, over the {MAX_MESSAGE >> 20} MB limit of one "
                    "call; pass smaller pieces (slice the text, send fewer images, or batch fewer prompts per call)"
                )
            self.outgoing.put(line)
            while True:
                # Short waits keep the main thread responsive to the SIGALRM timeout.
                try:
                    reply = slot.get(timeout=0.1)
                    break
                except Empty:
                    if self.closed.is_set():
                        raise RuntimeError(f"{name}: the host connection closed") from None
        finally:
            self.calls.pop(call_id, None)
        if not reply.get("ok"):
            error = reply.get("error") or f"{name} failed"
            kind = HOST_ERRORS.get(reply.get("error_type"), RuntimeError)
            if kind is not RuntimeError and error.startswith(f"{kind.__name__}: "):
                error = error[len(kind.__name__) + 2 :]
            raise kind(error)
        return reply.get("value")

    def define(self, name: str) -> None:
        def host_function(*args: Any, **kwargs: Any) -> Any:
            return self.host_call(name, _wire(args), _wire(kwargs))

        space, dot, attribute = name.partition(".")
        host_function.__name__, host_function.__qualname__ = attribute or name, name
        if not dot:
            self.owned[name] = self.namespace[name] = host_function
            return
        self.spaces.setdefault(space, {})[attribute] = host_function
        self.owned[space] = self.namespace[space] = SimpleNamespace(**self.spaces[space])

    # ---- the REPL's own names --------------------------------------------------------------------
    def reset_names(self) -> None:
        """Put back what guest code may have rebound or deleted since the last step: its builtins
        module, the real one (reachable as ``len.__self__`` or ``sys.modules["builtins"]``, and what the
        standard library the worker uses looks names up in), ``__builtins__`` and the names the REPL
        provides (SUBMIT, the host functions). Names the guest added stay."""
        REAL_BUILTINS.update(PRISTINE_BUILTINS)
        guest = self.guest_builtins.__dict__
        guest.update(PRISTINE_BUILTINS)
        guest["__import__"] = self._import
        self.namespace["__builtins__"] = self.guest_builtins
        for space, functions in self.spaces.items():
            self.owned[space] = SimpleNamespace(**functions)
        self.namespace.update(self.owned)

    def _variable(self, name: Any) -> str:
        """A variable's name, refused when it is one the REPL provides (it would be put back)."""
        checked = _identifier(name)
        if checked in self.owned or checked in RESERVED:
            raise ValueError(f"{checked!r} is the REPL's own name (SUBMIT or a host function); pick another")
        return checked

    def _import(
        self,
        name: str,
        globals: dict[str, Any] | None = None,
        locals: dict[str, Any] | None = None,
        fromlist: Any = (),
        level: int = 0,
    ) -> Any:
        """Guest code's ``__import__``: ``builtins`` is its own copy, anything else the real import."""
        if name == "builtins" and not level:
            return self.guest_builtins
        return REAL_IMPORT(name, globals, locals, fromlist, level)

    # ---- SUBMIT ----------------------------------------------------------------------------------
    def _submit(self, *args: Any, **kwargs: Any) -> None:
        fields = [f["name"] for f in self.output_fields or []]
        if not fields:
            if (args and kwargs) or len(args) > 1:
                raise TypeError("SUBMIT() takes one value (SUBMIT(x)) or keywords (SUBMIT(answer=x))")
            if args:
                kwargs = {"answer": args[0]}
            if not kwargs:
                raise TypeError("SUBMIT() needs a value: SUBMIT(x) or SUBMIT(answer=x)")
            raise _Submit(_jsonable(kwargs))
        usage = f"SUBMIT({', '.join(fields)}) or SUBMIT({', '.join(f + '=...' for f in fields)})"
        if len(args) > len(fields):
            raise TypeError(f"SUBMIT() takes {len(fields)} values but {len(args)} were given; use {usage}")
        values = dict(zip(fields, args, strict=False))
        for key, value in kwargs.items():
            if key not in fields:
                raise TypeError(f"SUBMIT() got an unknown field {key!r}; use {usage}")
            if key in values:
                raise TypeError(f"SUBMIT() got field {key!r} twice; use {usage}")
            values[key] = value
        missing = [f for f in fields if f not in values]
        if missing:
            names = ", ".join(map(repr, missing))
            raise TypeError(f"SUBMIT() missing required field(s) {names}; use {usage}")
        raise _Submit(_jsonable(values))

    # ---- execute ---------------------------------------------------------------------------------
    def _on_alarm(self, signum: int, frame: Any) -> None:
        if self.armed:
            raise _Timeout()

    def _remember_source(self, code: types.CodeType, lines: list[str]) -> None:
        self.sources[code] = lines
        for const in code.co_consts:
            if isinstance(const, types.CodeType):
                self._remember_source(const, lines)

    def _format_error(self, exc: BaseException) -> str:
        # Only frames of user code, so the model sees its own lines and not the worker's.
        lines = ["Traceback (most recent call last):\n"]
        tb = exc.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code.co_filename == REPL_FILENAME:
                lines.append(f'  File "{REPL_FILENAME}", line {tb.tb_lineno}, in {code.co_name}\n')
                source = self.sources.get(code)
                if source and 0 < tb.tb_lineno <= len(source):
                    lines.append(f"    {source[tb.tb_lineno - 1].strip()}\n")
            tb = tb.tb_next
        if len(lines) == 1:
            lines = []
        lines.extend(format_exception_only(type(exc), exc))
        return "".join(lines).rstrip("\n")

    def execute(self, msg: dict[str, Any]) -> dict[str, Any]:
        self.reset_names()
        code = msg.get("code", "")
        timeout = msg.get("timeout")
        limit = int(msg.get("output_limit") or 1_000_000)
        capture = _Capture(limit)
        reply: dict[str, Any] = {"op": "done", "id": msg.get("id"), "value": None, "error": None}
        reply.update(error_kind=None, final=None)
        start = monotonic()
        try:
            tree = parse(code, REPL_FILENAME, "exec")
            last = None
            if tree.body and isinstance(tree.body[-1], Expr):
                last = compile(Expression(tree.body.pop().value), REPL_FILENAME, "eval")
            body = compile(tree, REPL_FILENAME, "exec")
        except (SyntaxError, ValueError) as exc:
            reply.update(error="".join(format_exception_only(type(exc), exc)).rstrip("\n"))
            reply.update(error_kind="syntax", stdout="", duration=monotonic() - start)
            return reply
        _seed_random(code)
        source = code.splitlines()
        for compiled in (body, last):
            if compiled is not None:
                self._remember_source(compiled, source)
        saved = sys.stdout, sys.stderr
        self.capture, self.capture_id = capture, msg.get("id")
        sys.stdout, sys.stderr = _Stream(capture, False), _Stream(capture, True)
        try:
            try:
                if timeout:
                    self.armed = True
                    # The 1 s repeat re-raises if user code swallowed the first _Timeout with a bare except.
                    setitimer(ITIMER_REAL, float(timeout), 1.0)
                exec(body, self.namespace)
                if last is not None:
                    value = eval(last, self.namespace)
                    if value is not None:
                        reply["value"] = _truncate(repr(value), limit)
                        reply["data"] = _plain(value)
            finally:
                self.armed = False
                setitimer(ITIMER_REAL, 0)
                REAL_BUILTINS.update(PRISTINE_BUILTINS)  # what reporting the step uses of the stdlib
        except _Submit as sub:
            reply["final"] = sub.payload
        except _Timeout:
            reply["error_kind"] = "timeout"
            reply["error"] = (
                f"TimeoutError: the code ran longer than the {timeout:g} s limit and was interrupted "
                "(variables assigned before that are kept). Split the work into smaller steps, "
                "process less data per step, or use llm_query_batched instead of many sequential "
                "llm_query calls."
            )
        except MemoryError as exc:
            del exc  # free the traceback (and the frames holding big objects) first
            reply["error_kind"] = "memory"
            reply["error"] = (
                f"MemoryError: the sandbox memory cap of {self.memory_mb} MB was exceeded. "
                "Process the data in chunks, avoid copying large strings, and delete big intermediates."
            )
        except BaseException as exc:  # user errors, SystemExit, KeyboardInterrupt: all reported, never fatal
            reply["error_kind"] = "exception"
            reply["error"] = _truncate(self._format_error(exc), limit)
        finally:
            sys.stdout, sys.stderr = saved
            with self.stream_lock:
                self.capture = None
        reply["stdout"] = capture.text()
        reply["duration"] = monotonic() - start
        if reply["final"] is not None and len(_encode(reply)) > MAX_MESSAGE:
            reply["final"] = None
            reply["error_kind"] = "exception"
            reply["error"] = (
                f"ValueError: the SUBMIT payload is over the {MAX_MESSAGE >> 20} MB limit; "
                "submit a shorter answer (or write the long result to a volume file and submit its path)"
            )
        return reply

    # ---- other requests --------------------------------------------------------------------------
    def put_file(self, path: Any, blob: Any) -> None:
        """Write an input file (an image of the context) below the REPL's working folder, where the code's
        relative ``open`` finds it (the work folder here; the Daytona context's own folder there)."""
        parts = path.split("/") if isinstance(path, str) else []
        if not parts or path.startswith("/") or any(p in ("", ".", "..") for p in parts) or not isinstance(blob, bytes):
            raise ValueError(f"put_file takes a relative path and bytes, not {str(path)[:80]!r}")
        folder = os.path.join(os.getcwd(), *parts[:-1])
        os.makedirs(folder, exist_ok=True)
        fd = os.open(os.path.join(folder, parts[-1]), os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "wb") as fh:
            fh.write(blob)

    def handle(self, msg: dict[str, Any]) -> dict[str, Any]:
        op, req_id = msg.get("op"), msg.get("id")
        if op == "execute":
            try:
                return self.execute(msg)
            except BaseException as exc:  # the worker's own step code failed: still a reply to this step
                reply = {"op": "done", "id": req_id, "value": None, "final": None, "stdout": "", "duration": 0.0}
                error = f"the REPL failed around this step ({_describe(exc)}); the variables are kept"
                reply.update(error_kind="exception", error=error)
                return reply
        try:
            if op == "configure":
                self.output_fields = msg.get("output_fields") or None
            elif op == "define_functions":
                for name in msg.get("names", []):
                    parts = name.split(".") if isinstance(name, str) else []
                    valid = 1 <= len(parts) <= 2 and all(part.isidentifier() for part in parts)
                    if not valid or parts[0] in RESERVED:
                        raise ValueError(f"invalid function name {name!r}")
                    self.define(name)
            elif op == "set_var":
                self.namespace[self._variable(msg.get("name"))] = msg.get("value")
            elif op == "put_text":
                name = self._variable(msg.get("name"))
                blob = msg.pop("blob", None)
                if not isinstance(blob, bytes):
                    raise ValueError("put_text carries no text")
                self.namespace[name] = blob.decode("utf-8", "surrogatepass")
                del blob
            elif op == "put_file":
                self.put_file(msg.get("path"), msg.pop("blob", None))
            elif op == "append_var":
                current = self.namespace.get(self._variable(msg.get("name")))
                if not isinstance(current, list):  # the code rebound it: the host binds the whole list again
                    raise ValueError(f"{msg.get('name')!r} is not a list any more")
                current.append(msg.get("value"))
            else:
                raise ValueError(f"unknown op {op!r}")
        except MemoryError:
            return {"op": "error", "id": req_id, "error": f"MemoryError: over the {self.memory_mb} MB cap"}
        except Exception as exc:
            return {"op": "error", "id": req_id, "error": f"{type(exc).__name__}: {exc}"}
        return {"op": "ok", "id": req_id}

    def run(self) -> None:
        # Keep the real stdout for protocol messages only and send stray writes (C code, os.write(1))
        # to stderr, which the host merely logs.
        proto_fd = os.dup(1)
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        set_handler(SIGALRM, self._on_alarm)
        writer = threading.Thread(target=self.writer, args=(proto_fd,), name="fleet-writer", daemon=True)
        writer.start()
        threading.Thread(target=self.reader, name="fleet-reader", daemon=True).start()
        threading.Thread(target=self.streamer, name="fleet-stream", daemon=True).start()
        self.send({"op": "ready", "pid": os.getpid()})
        while True:
            msg = self.requests.get()
            if msg is None or msg.get("op") == "shutdown":
                break
            try:
                reply = self.handle(msg)
            except BaseException as exc:  # the loop must survive anything a request can raise
                reply = {"op": "error", "id": msg.get("id"), "error": _describe(exc)}
            try:
                self.send(reply)
            except BaseException as exc:  # no reply can be sent: say so now, not after the step's time limit
                _fatal(f"sending the reply to {msg.get('op')!r}", exc)
        self.outgoing.put(None)
        writer.join(timeout=5)
        # Skip interpreter teardown: it would wait for any non-daemon threads user code left running.
        _exit(0)


def _describe(exc: BaseException) -> str:
    try:
        return f"{type(exc).__name__}: {exc}"
    except BaseException:  # a guest exception's __str__ may fail too
        return type(exc).__name__


def _fatal(what: str, exc: BaseException) -> NoReturn:
    """The REPL's own machinery failed: say why on stderr (the host quotes its last lines when the
    worker exits) and exit at once, so the session ends with a clear error instead of a silent wait."""
    text = f"worker: {what} failed ({_describe(exc)}); the REPL cannot go on\n"
    try:
        _write(2, text.encode("utf-8", "replace"))
    finally:
        _exit(70)


def _seed_random(code: str) -> None:
    """Seed Python's ``random`` from the step's code before it runs, so a replay of the step draws what
    the recorded run drew (docs/replay.md); code that never touches ``random`` pays nothing."""
    module = sys.modules.get("random")
    if module is None and "random" in code:
        import random as module
    if module is not None:
        module.seed(code)


def _truncate(text: str, limit: int) -> str:
    """Keep head and tail of an over-long text (e.g. the repr of a 100 MB string)."""
    if len(text) <= limit:
        return text
    head, tail = text[: limit // 2], text[len(text) - (limit - limit // 2) :]
    return f"{head}\n... [{len(text) - limit} characters omitted] ...\n{tail}"


def _encode(message: dict[str, Any]) -> bytes:
    return dumps(message).encode("utf-8", "surrogatepass") + b"\n"


def loads(text: str) -> Any:
    """A JSON text's value. The scanner alone, not ``json.loads``: the stdlib's Python layer looks up
    ``len`` in the real builtins, which guest code can reach (``len.__self__``) while a step runs."""
    try:
        value, end = _scan(text, len(text) - len(text.lstrip()))
    except StopIteration as exc:
        raise ValueError(f"not JSON (at character {exc.value})") from None
    if text[end:].strip():
        raise ValueError(f"extra data after the JSON value (at character {end})")
    return value


def _plain(value: Any) -> Any:
    """The value itself when it is small plain JSON data (so callers can parse it), else None."""
    if isinstance(value, bool) or value is None:
        return value
    if isinstance(value, float) and value != value:  # NaN has no JSON form
        return None
    if not isinstance(value, (str, int, float, list, tuple, dict)):
        return None
    try:
        text = _dumps_data(value)
    except (TypeError, ValueError, RecursionError):
        return None
    # Through JSON and back: tuples become lists, keys strings, exactly as the host will see it.
    return loads(text) if len(text) <= PLAIN_DATA_CHARS else None


def _wire(value: Any, depth: int = 0) -> Any:
    """A host call's argument as it crosses to the host: bytes as ``{BYTES_TAG: base64}`` (JSON has no
    bytes, and ``default=str`` would send their repr), looked for inside lists, tuples and dicts too."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return {BYTES_TAG: b2a_base64(value, newline=False).decode("ascii")}
    if depth >= WIRE_DEPTH:
        return value
    if isinstance(value, (list, tuple)):
        return [_wire(item, depth + 1) for item in value]
    if isinstance(value, dict):
        return {key: _wire(item, depth + 1) for key, item in value.items()}
    return value


def _identifier(name: Any) -> str:
    if not (isinstance(name, str) and name.isidentifier()):
        raise ValueError(f"invalid variable name {name!r}")
    return name


def _jsonable(value: Any) -> Any:
    """Make a SUBMIT payload JSON-safe; anything JSON cannot hold becomes its str()."""
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        return value if value == value and value not in (float("inf"), float("-inf")) else str(value)
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    return str(value)


def _set_limits(memory_mb: int, max_procs: int) -> None:
    import resource

    def cap(kind: int, value: int) -> None:
        _, hard = resource.getrlimit(kind)
        if hard != resource.RLIM_INFINITY:
            value = min(value, hard)
        try:
            resource.setrlimit(kind, (value, value))
        except (ValueError, OSError) as exc:
            print(f"worker: could not set rlimit {kind}: {exc}", file=sys.stderr)

    # RLIMIT_AS turns runaway allocations into MemoryError instead of an OOM kill.
    cap(resource.RLIMIT_AS, memory_mb * 1024 * 1024)
    # Caps fork bombs. Note: the kernel does not enforce RLIMIT_NPROC for root (or CAP_SYS_RESOURCE),
    # and for other users it counts all processes of that user, so keep it generous.
    cap(resource.RLIMIT_NPROC, max_procs)
    cap(resource.RLIMIT_FSIZE, 16 * 1024**3)  # generous: only stops a runaway file write
    cap(resource.RLIMIT_CORE, 0)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="fleet-rlm sandbox worker")
    parser.add_argument("--workdir", required=True)
    parser.add_argument("--memory-mb", type=int, default=2048)
    parser.add_argument("--max-procs", type=int, default=64)
    args = parser.parse_args(argv)
    os.chdir(args.workdir)
    _set_limits(args.memory_mb, args.max_procs)
    Worker(args.workdir, args.memory_mb).run()


if __name__ == "__main__":
    main()
