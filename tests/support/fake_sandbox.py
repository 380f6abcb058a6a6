"""A fast in-process sandbox for tests that exercise the engine, not the isolation.

It implements the sandbox protocol (``fleet_rlm.sandbox.base.Sandbox``) with ``exec`` in a
dedicated thread, and registers itself as backend ``fake`` exactly as a real backend would, so
``FLEET_SANDBOX=fake`` selects it. It isolates nothing: never use it where an attack is tested.
The contract suite (tests/sandbox/test_contract.py) holds it to the same behaviour as the real one.
"""

from __future__ import annotations

import ast
import asyncio
import ctypes
import io
import json
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_rlm.sandbox.base import (
    Backend,
    ExecResult,
    HostFunction,
    SandboxError,
    SandboxSpec,
    cap_middle,
    input_file_path,
    register_backend,
)
from fleet_rlm.volumes import LocalVolumes, register_volumes

REPL = "<repl>"


class _Submit(BaseException):
    def __init__(self, payload: dict[str, Any]) -> None:
        super().__init__("SUBMIT")
        self.payload = payload


class _Timeout(BaseException):
    pass


class _Router(io.TextIOBase):
    """sys.stdout/err replacement that sends the writes of a capturing thread to its buffer."""

    def __init__(self, original: Any) -> None:
        self.original = original
        self.buffers: dict[int, list[str]] = {}

    def write(self, text: str) -> int:
        buf = self.buffers.get(threading.get_ident())
        if buf is None:
            return self.original.write(text)
        buf.append(text)
        return len(text)

    def flush(self) -> None:
        self.original.flush()


_router_lock = threading.Lock()


def _route() -> tuple[_Router, _Router]:
    import sys

    with _router_lock:
        if not isinstance(sys.stdout, _Router):
            sys.stdout = _Router(sys.stdout)
        if not isinstance(sys.stderr, _Router):
            sys.stderr = _Router(sys.stderr)
        return sys.stdout, sys.stderr  # type: ignore[return-value]


class FakeSandbox:
    """Same surface and REPL contract as LocalSandbox, in this process."""

    isolation = "none"

    def __init__(self, spec: SandboxSpec) -> None:
        self.spec = spec
        self.volume_paths = {name: str(path) for name, path in spec.volumes.items()}
        self.output_limit = spec.output_limit
        self._namespace: dict[str, Any] = {"__name__": "__main__"}
        self._functions: dict[str, HostFunction] = {}
        self._fields: list[str] = []
        self._loop: asyncio.AbstractEventLoop | None = None
        self._started = self._closed = False
        self._step = threading.Lock()
        self._executing = False

    @property
    def warnings(self) -> list[str]:
        return []

    @property
    def alive(self) -> bool:
        return self._started and not self._closed

    async def start(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox was shut down; create a new one")
        if not self._started:
            self._loop = asyncio.get_running_loop()
            self.spec.work_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            self._namespace["SUBMIT"] = self._submit
            self._started = True

    async def shutdown(self) -> None:
        self._closed = True

    def _check(self) -> None:
        if self._closed:
            raise SandboxError("the sandbox was shut down; create a new one")

    async def set_var(self, name: str, value: Any) -> None:
        await self.start()
        self._check()
        self._namespace[name] = json.loads(json.dumps(value))

    async def put_text(self, name: str, data: str | Path) -> None:
        await self.start()
        self._check()
        self._namespace[name] = data if isinstance(data, str) else Path(data).read_text(encoding="utf-8")

    async def append_var(self, name: str, value: Any) -> None:
        await self.start()
        self._check()
        current = self._namespace.get(name)
        if not isinstance(current, list):
            raise ValueError(f"{name!r} is not a list any more")
        current.append(json.loads(json.dumps(value)))

    async def put_file(self, path: str, data: Path) -> None:
        await self.start()
        self._check()
        target = self.spec.work_dir / input_file_path(path)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(Path(data).read_bytes())

    async def configure_output_fields(self, fields: list[dict[str, Any]]) -> None:
        self._fields = [f["name"] for f in fields]

    async def register_functions(self, fns: dict[str, HostFunction]) -> None:
        self._functions.update(fns)
        for name in fns:
            self._namespace[name] = self._bridge(name)

    def _bridge(self, name: str) -> Callable[..., Any]:
        def call(*args: Any, **kwargs: Any) -> Any:
            if not self._executing or self._loop is None:
                raise RuntimeError(f"{name}() can only be called while a step runs")
            future = asyncio.run_coroutine_threadsafe(self._functions[name](*args, **kwargs), self._loop)
            try:
                return future.result()
            except Exception as exc:
                raise RuntimeError(f"{type(exc).__name__}: {exc}") from None

        call.__name__ = name
        return call

    def _submit(self, *args: Any, **kwargs: Any) -> None:
        if not self._fields:
            if len(args) + len(kwargs) != 1 and not (kwargs and not args):
                raise TypeError("SUBMIT() takes one value (SUBMIT(x)) or keywords (SUBMIT(answer=x))")
            raise _Submit(kwargs or {"answer": args[0]})
        values = dict(zip(self._fields, args, strict=False)) | kwargs
        missing = [f for f in self._fields if f not in values]
        if missing:
            raise TypeError(f"SUBMIT() missing required field(s) {', '.join(map(repr, missing))}")
        raise _Submit(values)

    async def execute(
        self, code: str, *, timeout: float | None = None, on_output: Callable[[str], None] | None = None
    ) -> ExecResult:
        await self.start()
        self._check()
        limit = timeout if timeout is not None else self.spec.exec_timeout
        return await asyncio.to_thread(self._run, code, limit)

    def _run(self, code: str, limit: float | None) -> ExecResult:
        with self._step:
            self._executing = True
            try:
                return self._run_locked(code, limit)
            finally:
                self._executing = False

    def _run_locked(self, code: str, limit: float | None) -> ExecResult:
        start = time.monotonic()
        try:
            tree = ast.parse(code, REPL, "exec")
        except SyntaxError as exc:
            message = "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")
            return ExecResult("", None, message, "syntax", None, time.monotonic() - start)
        last = None
        if tree.body and isinstance(tree.body[-1], ast.Expr):
            last = compile(ast.Expression(tree.body.pop().value), REPL, "eval")
        body = compile(tree, REPL, "exec")
        out, err = _route()
        buf: list[str] = []
        me = threading.get_ident()
        out.buffers[me] = err.buffers[me] = buf
        timer = _alarm(me, limit)
        value = data = error = kind = final = None
        try:
            exec(body, self._namespace)
            if last is not None:
                result = eval(last, self._namespace)
                if result is not None:
                    value = repr(result)
                    data = _plain(result)
        except _Submit as sub:
            final = json.loads(json.dumps(sub.payload, default=str))
        except _Timeout:
            kind, error = "timeout", f"TimeoutError: the code ran longer than the {limit:g} s limit"
        except BaseException as exc:
            kind, error = "exception", "".join(traceback.format_exception_only(type(exc), exc)).rstrip("\n")
        finally:
            if timer is not None:
                timer.cancel()
            out.buffers.pop(me, None)
            err.buffers.pop(me, None)
        stdout = cap_middle("".join(buf), self.output_limit)
        return ExecResult(stdout, value, error, kind, final, time.monotonic() - start, data)  # type: ignore[arg-type]


def _alarm(thread_id: int, limit: float | None) -> threading.Timer | None:
    """Raise _Timeout in the executing thread after ``limit`` seconds (Python code only)."""
    if not limit:
        return None

    def fire() -> None:
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread_id), ctypes.py_object(_Timeout))

    timer = threading.Timer(limit, fire)
    timer.daemon = True
    timer.start()
    return timer


def _plain(value: Any) -> Any:
    try:
        return json.loads(json.dumps(value, allow_nan=False))
    except (TypeError, ValueError):
        return None


def register() -> None:
    register_backend(Backend("fake", lambda _settings, spec: FakeSandbox(spec), lambda _s: {"ok": True}, "tests"))
    register_volumes("fake", LocalVolumes.from_settings)  # it runs on this host: volumes are host folders
