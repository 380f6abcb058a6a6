"""An Agent Framework chat client over the runtime's own model access, for any configured model.

The model comes from the settings exactly as the runtime's: ``build_lm`` checks the model string and picks
the base URL and key (``agent_lm_*``, else the root model's ``lm_*``; a key only for the endpoint it was
given for, see ``config.key_for``). Each request goes the way dspy's ``LM`` would send it: through dspy's
native lm15 engine where it can carry the request (OpenAI-compatible servers, the major providers), else
through LiteLLM, which is then imported for the first time. LiteLLM's import costs several CPU-seconds,
longer than the rest of an agent's start, so a turn on a native route never pays it. Tool calling uses the
OpenAI function-calling format on the way in; replies stream token by token. Retryable failures (429, 5xx,
timeouts, a refused connection) are retried with backoff until something was shown. The framework's
layers come first in the class: without ``FunctionInvocationLayer`` no tool would ever run.
"""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from agent_framework import (
    BaseChatClient,
    ChatMiddlewareLayer,
    ChatResponse,
    ChatResponseUpdate,
    Content,
    FunctionInvocationLayer,
    Message,
)

from fleet_rlm.errors import FleetError, Unavailable, UserError
from fleet_rlm.redaction import redact_text

if TYPE_CHECKING:
    from fleet_rlm.config import Settings
    from fleet_rlm.core.lm import MeteredLM

MAX_TOOL_ROUNDS = 12  # model calls per turn segment: a confused model must not loop for long
MAX_BACKOFF = 30.0  # seconds between two attempts, whatever a server's Retry-After asks


class ModelChatClient(FunctionInvocationLayer, ChatMiddlewareLayer, BaseChatClient):  # type: ignore[misc]
    """``ModelChatClient.from_settings(settings)``: the agent's model, with tool calling and streaming."""

    OTEL_PROVIDER_NAME = "fleet-rlm"

    def __init__(self, lm: MeteredLM) -> None:
        super().__init__(function_invocation_configuration={"max_iterations": MAX_TOOL_ROUNDS})
        self.model = lm.model
        self._lm = lm  # its kwargs hold api_base, api_key and timeout: never logged or shown

    @classmethod
    def from_settings(cls, settings: Settings) -> ModelChatClient:
        from fleet_rlm.core.lm import build_lm

        return cls(build_lm(settings, role="agent"))

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Any:
        from dspy.clients.backend_selection import CLIENT_KEYS

        generation = {k: v for k, v in self._lm.kwargs.items() if k not in CLIENT_KEYS and v is not None}
        body: dict[str, Any] = {"messages": to_openai(messages), **generation}
        tools = [t.to_json_schema_spec() for t in options.get("tools") or [] if hasattr(t, "to_json_schema_spec")]
        if tools:
            body["tools"] = tools
            choice = options.get("tool_choice")
            if isinstance(choice, str) and choice in ("auto", "none", "required"):
                body["tool_choice"] = choice
        if stream:
            return self._build_response_stream(self._stream(body))
        return self._complete(body)

    async def _complete(self, body: dict[str, Any]) -> ChatResponse:
        from dspy.lm15 import TextPart, ToolCallPart

        route = self._route(body)
        try:
            for attempt in itertools.count():
                try:
                    response = await route.engine.complete(route.request)
                    break
                except Exception as exc:
                    await self._wait_or_raise(exc, attempt)
        finally:
            await route.engine.aclose()
        contents: list[Content] = []
        text = "".join(p.text for p in response.message.parts if isinstance(p, TextPart))
        if text:
            contents.append(Content.from_text(text))
        for call in response.message.parts_of(ToolCallPart):
            contents.append(Content.from_function_call(call.id, call.name, arguments=json.dumps(call.input)))
        return ChatResponse(messages=[Message(role="assistant", contents=contents)], model=self.model)

    async def _stream(self, body: dict[str, Any]) -> AsyncIterator[ChatResponseUpdate]:
        """Text as it arrives; tool calls (their arguments come in pieces) once complete, at the end."""
        route = self._route(body)
        calls: dict[int, dict[str, str]] = {}
        shown = False
        try:
            for attempt in itertools.count():
                try:
                    async for event in route.engine.stream(route.request):
                        if event.type != "delta":  # start and end carry nothing to show
                            continue
                        delta = event.delta
                        if delta.type == "text" and delta.text:
                            shown = True
                            yield ChatResponseUpdate(role="assistant", contents=[Content.from_text(delta.text)])
                        elif delta.type == "tool_call":
                            call = calls.setdefault(delta.part_index, {"id": "", "name": "", "arguments": ""})
                            call["id"] = delta.id or call["id"]
                            call["name"] = delta.name or call["name"]
                            call["arguments"] += delta.input
                    break
                except Exception as exc:
                    if shown:  # the user saw part of a reply: a second attempt would repeat it
                        raise self._explain(exc) from None
                    calls.clear()
                    await self._wait_or_raise(exc, attempt)
        finally:
            await route.engine.aclose()
        if calls:
            contents = [
                Content.from_function_call(c["id"] or f"call-{i}", c["name"], arguments=c["arguments"] or "{}")
                for i, c in sorted(calls.items())
            ]
            yield ChatResponseUpdate(role="assistant", contents=contents)

    def _route(self, body: dict[str, Any]) -> Route:
        try:
            return route_for(self._lm, body)
        except Exception as exc:  # a request neither route can carry, said as one sentence like a failed call
            raise self._explain(exc) from None

    async def _wait_or_raise(self, exc: Exception, attempt: int) -> None:
        """Back off before the next attempt if ``exc`` is transient and retries are left, else raise it explained."""
        from dspy import lm15

        transient = (lm15.RateLimitError, lm15.TimeoutError, lm15.ServerError, lm15.TransportError)
        if not isinstance(exc, transient) or attempt >= self._lm.num_retries:
            raise self._explain(exc) from None
        hint = getattr(exc, "retry_after", None)
        await asyncio.sleep(min(float(hint) if hint else 2.0**attempt, MAX_BACKOFF))

    def _explain(self, exc: Exception) -> FleetError:
        return explain(exc, self.model, self._lm.kwargs.get("api_base"), self._lm.key_note)


@dataclass
class Route:
    """How one request goes out: an engine (dspy's native lm15 engine or its LiteLLM one) and the request."""

    engine: Any
    request: Any


def route_for(lm: MeteredLM, body: dict[str, Any]) -> Route:
    """The route dspy's ``LM`` would take for ``body`` (an OpenAI chat request without its model): native
    where the model's provider and every part of the request can go that way, decided offline; else LiteLLM."""
    from dspy.clients.backend_selection import select_backend
    from dspy.clients.engines import AsyncLiteLLMEngine, AsyncLM15Engine
    from dspy.clients.engines.lm15_engine import timeouts_for
    from dspy.lm15 import LM15Error, RouterConfig, request_from_openai_chat

    body = {"model": lm.model, **body}
    selection = select_backend(lm)
    clients = selection.clients
    if selection.native:
        provider = selection.resolution.provider
        url = clients.get("api_base") or clients.get("base_url")
        config = RouterConfig(
            api_keys={provider: clients["api_key"]} if "api_key" in clients else None,
            base_urls={provider: url} if url else None,
            timeouts=timeouts_for(clients.get("timeout")),
        )
        engine = AsyncLM15Engine(config)
        try:
            request = request_from_openai_chat(body, compat=selection.resolution.compat)
            engine.plan(request)
            return Route(engine, request)
        except (LM15Error, TypeError, ValueError):
            pass  # a part the native route cannot carry: LiteLLM sends the request as written
    import litellm

    litellm.suppress_debug_info = True  # it would print a help banner on stdout (the MCP stdio channel)
    return Route(AsyncLiteLLMEngine(**clients), request_from_openai_chat(body))


def explain(exc: Exception, model: str, base: str | None, key_note: str | None = None) -> FleetError:
    """A failed model call as one sentence with the fix, secrets masked. Both routes raise lm15's errors."""
    from dspy import lm15

    where = f" at {base}" if base else ""
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, lm15.AuthError) and key_note:
        message: FleetError = UserError(f"{model}{where} refused the request: {key_note}")
    elif isinstance(exc, (lm15.AuthError, lm15.NotConfiguredError)):
        message = UserError(f"{model}{where} rejected the API key: set FLEET_AGENT_LM_API_KEY (or lm_api_key)")
    elif isinstance(exc, lm15.UnsupportedModelError) or getattr(exc, "status", None) == 404:
        message = UserError(f"{model}{where} is not a model it serves: check FLEET_AGENT_LM_MODEL")
    elif isinstance(exc, lm15.RateLimitError):
        message = Unavailable(f"{model} is rate limiting requests and retries ran out: wait and try again")
    elif isinstance(exc, lm15.TimeoutError):
        message = Unavailable(f"{model}{where} timed out: raise FLEET_LM_TIMEOUT or check the server's load")
    elif isinstance(exc, lm15.TransportError):
        message = Unavailable(f"cannot reach {model}{where}: is the server running? (check FLEET_AGENT_LM_API_BASE)")
    else:
        message = Unavailable(f"the agent's model {model}{where} failed: {first}")
    return type(message)(redact_text(message.message))


def result_text(content: Content) -> str:
    """A function result as the text the model reads."""
    result = content.result
    if isinstance(result, str):
        return result
    if isinstance(result, list):
        return "".join(getattr(item, "text", None) or "" for item in result) or json.dumps(result, default=str)
    return "" if result is None else json.dumps(result, default=str)


def to_openai(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The framework's messages in the OpenAI chat format: text, tool calls and tool results (approval
    requests and responses are the framework's bookkeeping, not the model's). Adjacent assistant messages
    merge, as strict providers want one assistant message per step."""
    out: list[dict[str, Any]] = []
    for message in messages:
        role = str(message.role)
        text = "".join(c.text or "" for c in message.contents if c.type == "text")
        calls = [c for c in message.contents if c.type == "function_call"]
        results = [c for c in message.contents if c.type == "function_result"]
        for result in results:
            out.append({"role": "tool", "tool_call_id": result.call_id, "content": result_text(result)})
        if results or not (text or calls):
            continue
        entry: dict[str, Any] = {"role": role, "content": text or None}
        if calls and role == "assistant":
            entry["tool_calls"] = [
                {
                    "id": c.call_id,
                    "type": "function",
                    "function": {
                        "name": c.name,
                        "arguments": c.arguments if isinstance(c.arguments, str) else json.dumps(c.arguments or {}),
                    },
                }
                for c in calls
            ]
        previous = out[-1] if out else None
        if role == "assistant" and previous is not None and previous["role"] == "assistant":
            previous["content"] = ((previous["content"] or "") + (text or "")) or None
            previous.setdefault("tool_calls", []).extend(entry.get("tool_calls", []))
            continue
        out.append(entry)
    return out
