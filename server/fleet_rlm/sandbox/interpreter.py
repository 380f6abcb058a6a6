"""dspy ``CodeInterpreter`` adapter over a sandbox backend, so stock ``dspy.RLM`` can use it:

dspy.RLM("context, query -> answer", interpreter_factory=SandboxInterpreter)

The local backend by default; ``sandbox_factory`` takes any backend of the sandbox protocol.
It keeps dspy's contract as ``LocalInterpreter`` does: the same checks of tool names, SUBMIT's
fields and variables, failing with the same error types at the same moment (before any sandbox
starts), ``SUBMIT(x)`` giving ``{"output": x}`` without fields, and dspy callbacks (instance ones
and ``dspy.context(callbacks=...)``) seeing start, executions, tool calls and shutdown.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
import json
import keyword
import shutil
import tempfile
import threading
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, Literal, TypeVar

from dspy.primitives.code_interpreter import CodeExecutionError, CodeInterpreterError, FinalOutput
from dspy.utils.callback import BaseCallback, with_callbacks

from fleet_rlm.sandbox.base import ExecResult, Sandbox, SandboxError
from fleet_rlm.sandbox.local import LocalSandbox

T = TypeVar("T")

# Strings longer than this are sent as raw text (put_text), not JSON, and only when they change.
BIG_TEXT = 1024 * 1024
OWNED_GLOBALS = frozenset({"SUBMIT", "__builtins__"})  # no tool or variable may replace these
DEFAULT_FIELDS = [{"name": "output"}]  # SUBMIT(x) without output fields gives {"output": x}, as in dspy


def _plain_name(name: object) -> bool:
    return isinstance(name, str) and name.isidentifier() and not keyword.iskeyword(name) and name not in OWNED_GLOBALS


def check_tool_names(tools: dict[str, Any]) -> None:
    """dspy's rule for tool names (ValueError, as ``LocalInterpreter`` raises it)."""
    invalid = [name for name in tools if not _plain_name(name)]
    if invalid:
        raise ValueError(f"tool names must be non-reserved Python identifiers; invalid names: {invalid!r}")


def check_output_fields(fields: list[dict[str, Any]] | None) -> None:
    """dspy's rule for SUBMIT's fields: unique non-keyword identifiers, JSON-compatible (ValueError)."""
    if fields is None:
        return
    names = [f.get("name") if isinstance(f, dict) else None for f in fields]
    if not all(isinstance(n, str) and n.isidentifier() and not keyword.iskeyword(n) for n in names):
        raise ValueError("output field names must be non-keyword Python identifiers")
    if len(names) != len(set(names)):
        raise ValueError("output field names must be unique")
    try:
        json.dumps(fields, allow_nan=False)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"output fields must be JSON-compatible: {exc}") from exc


def check_variables(variables: Any, tools: dict[str, Any]) -> None:
    """dspy's rule for variables (CodeInterpreterError): plain names that no tool has, JSON-compatible values."""
    if not isinstance(variables, dict):
        raise CodeInterpreterError("variables must map Python identifiers to JSON-compatible values")
    invalid = [name for name in variables if not _plain_name(name) or name in tools]
    if invalid:
        raise CodeInterpreterError(
            "variable names must be non-reserved Python identifiers distinct from tool names; "
            f"invalid names: {invalid!r}"
        )
    for name, value in variables.items():
        if isinstance(value, str):  # always JSON; a big input is not encoded on every step just to check
            continue
        try:
            json.dumps(value, allow_nan=False)
        except (TypeError, ValueError) as exc:
            raise CodeInterpreterError(f"variable {name!r} must be JSON-compatible: {exc}") from exc


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
        callbacks: list[BaseCallback] | None = None,
    ) -> None:
        check_tool_names(tools or {})
        fields = None if output_fields is None else [dict(f) for f in output_fields]
        check_output_fields(fields)
        self.tools: dict[str, Callable[..., Any]] = dict(tools or {})
        self.output_fields = fields
        self.callbacks = list(callbacks or [])  # with dspy.settings.callbacks, as dspy's interpreters have them
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
            # Run in the context of the caller of execute(), so dspy.context(lm=..., callbacks=...) reaches tools.
            return await asyncio.create_task(self.invoke_tool(name, list(args), kwargs), context=self._context.copy())

        return proxy

    @with_callbacks
    async def invoke_tool(self, tool_name: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
        """One host tool called from sandboxed code (dspy's tool-call callbacks see it)."""
        tool = self.tools.get(tool_name)  # looked up per call: dspy may replace or pop tools
        if tool is None:
            raise LookupError(f"tool {tool_name!r} is no longer available")
        if inspect.iscoroutinefunction(tool):
            return await tool(*args, **kwargs)
        result = await asyncio.to_thread(tool, *args, **kwargs)  # in a copy of this task's context
        return await result if inspect.isawaitable(result) else result

    # ---- CodeInterpreter protocol ----------------------------------------------------------------
    @with_callbacks
    def start(self) -> None:
        self._check_open()
        if self._loop is None:
            self._loop = asyncio.new_event_loop()
            self._thread = threading.Thread(target=self._loop.run_forever, name="fleet-sandbox", daemon=True)
            self._thread.start()
        if self._sandbox is None:
            try:
                self._sandbox = self._factory(self.work_dir)
            except SandboxError as exc:
                raise CodeInterpreterError(str(exc)) from exc
        self._refresh()

    def _check_open(self) -> None:
        if self._closed:
            raise CodeInterpreterError("SandboxInterpreter was shut down; create a new one")

    def _refresh(self) -> None:
        """The sandbox running (a dead worker raises) with the current tools and SUBMIT fields."""
        self._check_open()
        assert self._sandbox is not None
        self._call(self._sandbox.start())
        self._sync_registrations()

    def _sync_registrations(self) -> None:
        assert self._sandbox is not None
        new = [name for name in self.tools if name not in self._registered]
        if new or not self._tools_registered:
            self._call(self._sandbox.register_functions({n: self._tool_proxy(n) for n in self.tools}))
            self._registered.update(self.tools)
            self._tools_registered = True
        fields = DEFAULT_FIELDS if self.output_fields is None else [dict(f) for f in self.output_fields]
        if fields != self._sent_fields:
            self._call(self._sandbox.configure_output_fields(fields))
            self._sent_fields = fields

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
        self._call(self._sandbox.set_var(name, value))

    @with_callbacks
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
        # dspy's checks, in LocalInterpreter's order, before anything starts: a refused call costs nothing.
        check_tool_names(self.tools)
        check_output_fields(self.output_fields)
        if not isinstance(code, str):
            raise CodeInterpreterError("code must be a string")
        variables = {} if variables is None else variables
        check_variables(variables, self.tools)
        self._context = contextvars.copy_context()
        if self._sandbox is None:
            self.start()  # once, as LocalInterpreter does: dspy's startup callbacks fire once
        else:
            self._refresh()
        assert self._sandbox is not None
        try:
            for name, value in variables.items():
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

    @with_callbacks
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
