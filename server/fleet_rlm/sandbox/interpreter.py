"""dspy ``CodeInterpreter`` adapter over a sandbox backend, so stock ``dspy.RLM`` can use it:

dspy.RLM("context, query -> answer", interpreter_factory=SandboxInterpreter)

The local backend by default; ``sandbox_factory`` takes any backend of the sandbox protocol.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal, TypeVar

from dspy.primitives.code_interpreter import CodeExecutionError, CodeInterpreterError, FinalOutput

from fleet_rlm.sandbox.base import ExecResult, Sandbox, SandboxError
from fleet_rlm.sandbox.local import LocalSandbox

T = TypeVar("T")

# Strings longer than this are sent as raw text (put_text), not JSON, and only when they change.
BIG_TEXT = 1024 * 1024


class SandboxInterpreter:
    """Synchronous dspy interpreter running code in a :class:`LocalSandbox`.

    The sandbox is async; it runs on a private event loop in a daemon thread so dspy's sync
    ``execute`` can drive it. Host tools (``llm_query`` etc.) run in worker threads, so many calls
    from sandboxed threads proceed concurrently.
    """

    execution_instructions = (
        "Code runs in a persistent, isolated Python REPL (standard library only, no network). "
        "Variables persist between steps; a trailing expression's value is shown along with printed output. "
        "Each step has a time limit; tools and SUBMIT are global functions and may be called from threads."
    )

    def __init__(
        self,
        work_dir: Path | str | None = None,
        *,
        tools: dict[str, Callable[..., Any]] | None = None,
        output_fields: list[dict[str, Any]] | None = None,
        isolation: Literal["auto", "bwrap", "none"] = "auto",
        memory_mb: int = 2048,
        exec_timeout: float = 300.0,
        volumes: dict[str, Path] | None = None,
        sandbox_factory: Callable[[Path], Sandbox] | None = None,
    ) -> None:
        self.tools: dict[str, Callable[..., Any]] = dict(tools or {})
        self.output_fields = output_fields
        self._tools_registered = False
        self._owns_dir = work_dir is None
        self.work_dir = Path(tempfile.mkdtemp(prefix="fleet-sandbox-") if work_dir is None else work_dir)
        self._sandbox_args: dict[str, Any] = dict(
            isolation=isolation, memory_mb=memory_mb, exec_timeout=exec_timeout, volumes=volumes
        )
        self._factory = sandbox_factory or (lambda work: LocalSandbox(work, **self._sandbox_args))
        self._sandbox: Sandbox | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._registered: set[str] = set()
        self._sent_fields: list[dict[str, Any]] | None = None
        self._bound: dict[str, tuple[int, int, int]] = {}  # big strings already in the REPL, by name
        self._executing = threading.Lock()
        self._context = contextvars.copy_context()
        self._closed = False

    # ---- loop plumbing ---------------------------------------------------------------------------
    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        assert self._loop is not None
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        try:
            return self._run(coro)
        except SandboxError as exc:
            raise CodeInterpreterError(str(exc)) from exc

    def _tool_proxy(self, name: str) -> Callable[..., Any]:
        async def proxy(*args: Any, **kwargs: Any) -> Any:
            tool = self.tools.get(name)  # looked up per call: dspy may replace or pop tools
            if tool is None:
                raise LookupError(f"tool {name!r} is no longer available")
            # Run in the context of the caller of execute(), so dspy.context(lm=...) reaches tools.
            ctx = self._context.copy()
            if inspect.iscoroutinefunction(tool):
                return await asyncio.create_task(tool(*args, **kwargs), context=ctx)
            result = await asyncio.to_thread(ctx.run, tool, *args, **kwargs)
            return await result if inspect.isawaitable(result) else result

        return proxy

    # ---- CodeInterpreter protocol ----------------------------------------------------------------
    def start(self) -> None:
        if self._closed:
            raise CodeInterpreterError("SandboxInterpreter was shut down; create a new one")
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="fleet-sandbox", daemon=True)
            self._thread.start()
        if self._sandbox is None:
            try:
                self._sandbox = self._factory(self.work_dir)
            except SandboxError as exc:
                raise CodeInterpreterError(str(exc)) from exc
        self._call(self._sandbox.start())
        self._sync_registrations()

    def _sync_registrations(self) -> None:
        assert self._sandbox is not None
        new = [name for name in self.tools if name not in self._registered]
        if new or not self._tools_registered:
            self._call(self._sandbox.register_functions({n: self._tool_proxy(n) for n in self.tools}))
            self._registered.update(self.tools)
            self._tools_registered = True
        if self.output_fields != self._sent_fields:
            fields = [dict(f) for f in self.output_fields or []]
            self._call(self._sandbox.configure_output_fields(fields))
            self._sent_fields = None if self.output_fields is None else fields

    def _bind(self, name: str, value: Any) -> None:
        assert self._sandbox is not None
        if isinstance(value, str) and len(value) > BIG_TEXT:
            # dspy passes the same variables every step: send a big string once (str hashes are cached).
            key = (id(value), len(value), hash(value))
            if self._bound.get(name) != key:
                self._call(self._sandbox.put_text(name, value))
                self._bound[name] = key
            return
        self._bound.pop(name, None)
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CodeInterpreterError(f"variable {name!r} must be JSON-compatible: {exc}") from exc
        self._call(self._sandbox.set_var(name, value))

    def execute(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        # A tool that calls execute again would wait forever for the step that is calling it.
        if not self._executing.acquire(blocking=False):
            raise CodeInterpreterError(
                "SandboxInterpreter.execute was called while another execute is running (re-entrant use, "
                "e.g. from a tool); one interpreter runs one step at a time: use a second interpreter"
            )
        try:
            return self._execute(code, variables)
        finally:
            self._executing.release()

    def _execute(self, code: str, variables: dict[str, Any] | None) -> Any:
        self._context = contextvars.copy_context()
        self.start()
        assert self._sandbox is not None
        try:
            for name, value in (variables or {}).items():
                self._bind(name, value)
        except ValueError as exc:
            raise CodeInterpreterError(str(exc)) from exc
        result: ExecResult = self._call(self._sandbox.execute(code))
        if result.final is not None:
            return FinalOutput(result.final)
        if result.error_kind == "syntax":
            raise SyntaxError(result.error)
        if result.error_kind is not None:
            prefix = f"{result.stdout.rstrip()}\n" if result.stdout.strip() else ""
            raise CodeExecutionError(prefix + (result.error or result.error_kind))
        if result.data is not None and not result.stdout.strip():
            return result.data  # plain data as a value, like dspy's own interpreters
        text = result.stdout
        if result.value is not None:
            text += ("" if not text or text.endswith("\n") else "\n") + result.value
        return text or None

    def shutdown(self) -> None:
        self._closed = True
        if self._loop is not None:
            if self._sandbox is not None:
                with contextlib.suppress(Exception):  # best effort: the worker may already be gone
                    self._run(self._sandbox.shutdown())
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(timeout=5)
            if not self._loop.is_running():
                self._loop.close()
            self._loop = None
        self._bound.clear()
        if self._owns_dir:
            shutil.rmtree(self.work_dir, ignore_errors=True)

    def __call__(self, code: str, variables: dict[str, Any] | None = None) -> Any:
        return self.execute(code, variables)

    def __enter__(self) -> SandboxInterpreter:
        self.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.shutdown()
