"""Tools in the REPL (docs/tools.md): the tools of configured MCP servers and the user's own Python
functions, as plain functions of the sandboxed code (``github.search_issues(query=...)``,
``word_count(text)``). The host holds the MCP client sessions, opened for the run and closed at its
end; the sandbox only reaches them through its host-call bridge (it keeps no network). Each call has
a time and a result-size cap, is a ``tool.called`` event, and is kept in the run's record, so a
replay (or a fork's first steps) answers it from there with no server running (``core.node._kept``).

A tool that its server does not mark read-only (MCP annotations) may change things: a run calls it
only when its request allows it (``allow_tools``: "server.tool" or "server.*"); otherwise the REPL
gets a PermissionError.
"""

from __future__ import annotations

import asyncio
import builtins
import contextlib
import importlib
import inspect
import json
import keyword
import re
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import asdict, dataclass
from typing import Any

from fleet_rlm.config import McpServerSpec, Settings
from fleet_rlm.core.tape import TOOLS_SLOT, Tape
from fleet_rlm.errors import Unavailable, UserError
from fleet_rlm.redaction import redact_text
from fleet_rlm.types import RunRequest

PYTHON = "python"  # the "server" of a registered Python function
# Names the REPL already has: no tool or server may take them.
REPL_NAMES = frozenset(
    {"SUBMIT", "llm_query", "llm_query_batched", "rlm_query", "rlm_query_batched", "context", "query", "sources",
     "history"}
)  # fmt: skip
DESCRIPTION_CHARS = 300


def repl_name(name: str) -> str:
    """A server's or tool's name as a Python identifier (``my-server`` -> ``my_server``)."""
    text = re.sub(r"\W", "_", name) or "_"
    return f"_{text}" if text[0].isdigit() or keyword.iskeyword(text) else text


def _taken(name: str) -> bool:
    return name in REPL_NAMES or hasattr(builtins, name) or keyword.iskeyword(name)


def check_tools_request(settings: Settings, req: RunRequest) -> None:
    """Refuse, with the fix, a request naming a server that is not configured, a tool that cannot be
    imported, or an allowance that names no mounted server (the admission of core.admission)."""
    configured = sorted(settings.mcp_servers)
    for name in req.mcp_servers:
        if name not in settings.mcp_servers:
            listed = ", ".join(configured) if configured else "none are configured (FLEET_MCP_SERVERS)"
            raise UserError(f"MCP server {name!r} is not configured; the configured servers: {listed}")
        if _taken(repl_name(name)):
            raise UserError(f"MCP server {name!r} would hide the REPL's own {repl_name(name)!r}: rename it")
    mounted = {*req.mcp_servers, PYTHON}
    for allowed in req.allow_tools:
        server, dot, tool = allowed.partition(".")
        if not dot or not tool or server not in mounted:
            raise UserError(
                f"allow_tools entry {allowed!r}: give SERVER.TOOL (or SERVER.*) of a server this run mounts "
                f"({', '.join(sorted(req.mcp_servers)) or 'none'})"
            )
    names: set[str] = set()
    for ref in [*settings.tools, *req.tools]:
        spec = python_spec(ref, load_function(ref))
        if spec.name in names or spec.name in {repl_name(n) for n in req.mcp_servers}:
            raise UserError(f"tool {ref!r}: the REPL already has a tool or server named {spec.name!r}")
        names.add(spec.name)


@dataclass(frozen=True)
class ToolSpec:
    """One tool as the REPL has it: its name there, where it goes, and what the model is told."""

    server: str  # the configured MCP server's name, or "python"
    remote: str  # its name at the server, or "module:function"
    space: str | None  # the REPL namespace (the server's name as an identifier); None: a plain function
    name: str  # the REPL name (inside ``space``)
    description: str
    schema: dict[str, Any]  # the input JSON Schema (MCP), or {} (Python)
    signature: str | None  # a Python function's signature
    needs_allow: bool  # not marked read-only: a run calls it only when allowed

    @property
    def call_name(self) -> str:
        return f"{self.space}.{self.name}" if self.space else self.name

    @property
    def full_name(self) -> str:
        return f"{self.server}.{self.remote}"

    def shown(self) -> str:
        """One line for the opening observation: the call with its parameters, then what it does."""
        params = self.signature if self.signature is not None else f"({render_params(self.schema)})"
        note = " [changes things: allowed only via allow_tools]" if self.needs_allow else ""
        about = self.description.strip().splitlines()[0] if self.description.strip() else ""
        return f"  {self.call_name}{params}{note}" + (f" - {about[:DESCRIPTION_CHARS]}" if about else "")


def render_params(schema: dict[str, Any]) -> str:
    """A JSON Schema's properties as a compact parameter list: ``query: string, limit?: integer=10``."""
    props = schema.get("properties") or {}
    required = set(schema.get("required") or [])
    parts = []
    for name, prop in props.items():
        prop = prop if isinstance(prop, dict) else {}
        kind = prop.get("type") or "|".join(str(p.get("type")) for p in prop.get("anyOf", []) if isinstance(p, dict))
        if isinstance(kind, list):
            kind = "|".join(map(str, kind))
        text = f"{name}{'' if name in required else '?'}: {kind or 'any'}"
        if "default" in prop:
            text += f"={json.dumps(prop['default'])}"
        if prop.get("enum"):
            text += f" (one of {json.dumps(prop['enum'])[:80]})"
        parts.append(text)
    return ", ".join(parts)


def load_function(ref: str) -> Callable[..., Any]:
    """The callable a ``module:function`` reference names, imported here: the user's explicit choice."""
    module, colon, attr = ref.partition(":")
    if not (colon and module and attr):
        raise UserError(f"tool {ref!r}: give it as module:function (mypackage.tools:word_count)")
    try:
        value: Any = importlib.import_module(module)
        for part in attr.split("."):
            value = getattr(value, part)
    except ImportError as exc:
        raise UserError(f"tool {ref!r}: cannot import {module!r} ({exc}); is it on PYTHONPATH?") from None
    except AttributeError:
        raise UserError(f"tool {ref!r}: {module!r} has no {attr!r}") from None
    if not callable(value):
        raise UserError(f"tool {ref!r} is not a function")
    return value  # type: ignore[no-any-return]


def python_spec(ref: str, fn: Callable[..., Any]) -> ToolSpec:
    name = ref.partition(":")[2].rpartition(".")[2]
    if not name.isidentifier() or _taken(name):
        raise UserError(f"tool {ref!r}: {name!r} is the REPL's own name or not an identifier; wrap it under another")
    try:
        signature = str(inspect.signature(fn))
    except (TypeError, ValueError):
        signature = "(*args, **kwargs)"
    return ToolSpec(PYTHON, ref, None, name, inspect.getdoc(fn) or "", {}, signature[:300], False)


def mcp_spec(server: str, tool: Any) -> ToolSpec:
    """A tool an MCP server listed (``mcp.types.Tool``)."""
    annotations = tool.annotations
    read_only = bool(annotations and annotations.read_only_hint)
    schema = tool.input_schema if isinstance(tool.input_schema, dict) else {}
    return ToolSpec(
        server, tool.name, repl_name(server), repl_name(tool.name), tool.description or "", schema, None, not read_only
    )


class ToolBox:
    """The tools one run's REPL has, and what calls them (None for a replayed run's: the record answers)."""

    def __init__(self, specs: list[ToolSpec], settings: Settings, allow: list[str], callers: dict[str, Any]) -> None:
        self.specs = specs
        self.settings = settings
        self.allow = set(allow)
        self.callers = callers  # full_name -> an MCP client (``mcp.Client``) or a Python callable

    def describe(self) -> str:
        lines = ["tools (plain functions; each call runs on the host, outside the sandbox, and is recorded):"]
        return "\n".join(lines + [spec.shown() for spec in self.specs])

    def functions(self, emit: Callable[[str, dict[str, Any]], None]) -> dict[str, ToolFunction]:
        """The REPL's functions (``"server.tool"`` or ``"name"``) for one node, its events through ``emit``."""
        return {spec.call_name: ToolFunction(self, spec, emit) for spec in self.specs}

    def allowed(self, spec: ToolSpec) -> bool:
        return not spec.needs_allow or spec.full_name in self.allow or f"{spec.server}.*" in self.allow

    def catalog(self) -> dict[str, Any]:
        return {"tools": [asdict(spec) for spec in self.specs]}


class ToolFunction:
    """One tool as a host function of the sandbox: caps, the allow list, the event."""

    def __init__(self, box: ToolBox, spec: ToolSpec, emit: Callable[[str, dict[str, Any]], None]) -> None:
        self.box, self.spec, self.emit = box, spec, emit

    async def __call__(self, *args: Any, **kwargs: Any) -> Any:
        spec, settings = self.spec, self.box.settings
        arg_chars = _chars([args, kwargs])
        started = time.monotonic()
        value, result_chars, error = None, 0, None
        try:
            if not self.box.allowed(spec):
                raise PermissionError(
                    f"{spec.call_name}() may change things (server {spec.server!r} does not mark tool {spec.remote!r} "
                    f"read-only), and this run does not allow it: start the run with --allow-tool {spec.full_name} "
                    "(allow_tools) to let it"
                )
            caller = self.box.callers.get(spec.full_name)
            if caller is None:
                raise RuntimeError(f"{spec.call_name}: the tool is not connected in this run")
            try:
                value = await asyncio.wait_for(self._call(caller, args, kwargs), settings.tool_timeout)
            except TimeoutError:
                raise TimeoutError(
                    f"{spec.call_name}() took longer than {settings.tool_timeout:g} s (FLEET_TOOL_TIMEOUT)"
                ) from None
            result_chars = _chars(value)
            if result_chars > settings.tool_result_max_chars:
                value = None
                raise ValueError(
                    f"{spec.call_name}() returned {result_chars:,} characters, over the "
                    f"{settings.tool_result_max_chars:,} a call may (FLEET_TOOL_RESULT_MAX_CHARS): ask it for less"
                )
            return value
        except Exception as exc:
            error = redact_text(f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self._event(arg_chars, result_chars, time.monotonic() - started, error)

    async def _call(self, caller: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        spec = self.spec
        if spec.server == PYTHON:
            if inspect.iscoroutinefunction(caller):
                return await caller(*args, **kwargs)
            return await asyncio.to_thread(caller, *args, **kwargs)
        arguments = dict(kwargs)
        names = list((spec.schema.get("properties") or {}).keys())
        if len(args) > len(names):
            raise TypeError(f"{spec.call_name}() takes at most {len(names)} positional arguments ({', '.join(names)})")
        for name, arg in zip(names, args, strict=False):
            if name in arguments:
                raise TypeError(f"{spec.call_name}() got argument {name!r} twice")
            arguments[name] = arg
        try:
            result = await caller.call_tool(spec.remote, arguments, read_timeout_seconds=self.box.settings.tool_timeout)
        except Exception as exc:  # the protocol's error (an unknown tool, bad arguments): the server's message
            raise RuntimeError(f"{spec.call_name}: {_message(exc)}") from None
        return mcp_value(spec, result)

    def replayed(self, body: dict[str, Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """The event of a call the record answered."""
        error = body.get("error")
        self._event(_chars([args, kwargs]), 0 if error else _chars(body.get("value")), 0.0, error, replayed=True)

    def _event(
        self, arg_chars: int, result_chars: int, seconds: float, error: str | None, replayed: bool = False
    ) -> None:
        data: dict[str, Any] = {
            "server": self.spec.server,
            "tool": self.spec.remote,
            "arg_chars": arg_chars,
            "result_chars": result_chars,
            "seconds": round(seconds, 4),
            "error": error,
        }
        self.emit("tool.called", data | ({"replayed": True} if replayed else {}))


def mcp_value(spec: ToolSpec, result: Any) -> Any:
    """A ``CallToolResult`` as a Python value: its structured content, else its text; an error result raises
    with the server's message."""
    texts = [getattr(b, "text", None) or f"[{getattr(b, 'type', 'unknown')} content]" for b in result.content or []]
    if result.is_error:
        raise RuntimeError(f"{spec.call_name}: {' '.join(texts) or 'the server reported an error'}")
    structured = result.structured_content
    if structured is not None:
        if isinstance(structured, dict) and list(structured) == ["result"]:  # a plain value, wrapped by the SDK
            return structured["result"]
        return structured
    if not texts:
        return None
    return texts[0] if len(texts) == 1 else texts


def reraise(error: str) -> Exception:
    """A recorded error (``"Type: message"``) as the exception the REPL saw when it was recorded."""
    kind, _, message = error.partition(": ")
    known: dict[str, type[Exception]] = {"PermissionError": PermissionError, "TimeoutError": TimeoutError}
    if kind in known:
        return known[kind](message)
    if kind.isidentifier():  # named as recorded, so the REPL reads the very text it read then
        named: Exception = type(kind, (RuntimeError,), {})(message)
        return named
    return RuntimeError(error)


def _chars(value: Any) -> int:
    return len(json.dumps(value, ensure_ascii=False, default=str))


def _message(exc: BaseException) -> str:
    if isinstance(exc, BaseExceptionGroup) and exc.exceptions:
        return _message(exc.exceptions[0])
    return str(getattr(exc, "message", None) or exc) or type(exc).__name__


# -- opening and closing ---------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def open_tools(settings: Settings, req: RunRequest, tape: Tape | None) -> AsyncIterator[ToolBox | None]:
    """The run's tools: its MCP servers connected (closed when the run ends) and its Python functions
    imported, the catalog kept in the run's record. A replay connects nothing: its catalog is the
    recorded one and the record answers every call."""
    if tape is not None and tape.mode == "replay":
        recorded = tape.source_body(TOOLS_SLOT)
        if recorded is None:
            yield None
            return
        replayed = [ToolSpec(**spec) for spec in recorded.get("tools") or []]
        tape.keep(TOOLS_SLOT, "", 0, recorded, {})
        yield ToolBox(replayed, settings, list(req.allow_tools), {})
        return
    refs = [*settings.tools, *req.tools]
    if not req.mcp_servers and not refs:
        yield None
        return
    async with contextlib.AsyncExitStack() as stack:
        specs: list[ToolSpec] = []
        callers: dict[str, Any] = {}
        for name in req.mcp_servers:
            try:  # a server that never answers its handshake costs the tool timeout, not the run
                async with asyncio.timeout(settings.tool_timeout):
                    client = await _connect(stack, name, settings.mcp_servers[name])
                    listed = await _list_tools(name, client)
            except TimeoutError:
                raise Unavailable(
                    f"MCP server {name!r} did not answer within {settings.tool_timeout:g} s (FLEET_TOOL_TIMEOUT): "
                    "check its command or URL"
                ) from None
            for tool in listed:
                spec = mcp_spec(name, tool)
                specs.append(spec)
                callers[spec.full_name] = client
        for ref in refs:
            fn = load_function(ref)
            spec = python_spec(ref, fn)
            specs.append(spec)
            callers[spec.full_name] = fn
        box = ToolBox(specs, settings, list(req.allow_tools), callers)
        if tape is not None:
            tape.keep(TOOLS_SLOT, "", 0, box.catalog(), {})
        yield box


async def _connect(stack: contextlib.AsyncExitStack, name: str, spec: McpServerSpec) -> Any:
    from mcp.client.stdio import StdioServerParameters
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    from mcp import Client

    transport: Any
    if spec.type == "http":
        headers = {k: v.get_secret_value() for k, v in spec.headers.items()}
        http = await stack.enter_async_context(create_mcp_http_client(headers=headers))
        transport = streamable_http_client(str(spec.url), http_client=http)
    else:
        env = {k: v.get_secret_value() for k, v in spec.env.items()}
        transport = StdioServerParameters(command=str(spec.command), args=spec.args, env=env or None, cwd=spec.cwd)
    try:
        return await stack.enter_async_context(Client(transport))
    except Exception as exc:
        raise Unavailable(f"MCP server {name!r} could not be reached: {redact_text(_message(exc))}") from None


async def _list_tools(name: str, client: Any) -> list[Any]:
    tools: list[Any] = []
    cursor = None
    try:
        while True:
            page = await client.list_tools(cursor=cursor)
            tools.extend(page.tools)
            cursor = page.next_cursor
            if not cursor:
                return tools
    except Exception as exc:
        raise Unavailable(f"MCP server {name!r} did not list its tools: {redact_text(_message(exc))}") from None
