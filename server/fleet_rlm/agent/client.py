"""An Agent Framework chat client over the runtime's own model access (LiteLLM), for any configured model.

The model comes from the settings exactly as the runtime's: ``build_lm`` checks the LiteLLM model string
and picks the base URL and key (``agent_lm_*``, else the root model's ``lm_*``; a key only for the endpoint
it was given for, see ``config.key_for``), and the request goes out through ``litellm.acompletion`` with
the same keyword arguments dspy would send. Tool calling uses the OpenAI function-calling format, which
LiteLLM translates for every provider; replies stream token by token. The framework's layers come first
in the class: without ``FunctionInvocationLayer`` no tool would ever run.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping, Sequence
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

MAX_TOOL_ROUNDS = 12  # model calls per turn segment: a confused model must not loop for long


class LiteLLMChatClient(FunctionInvocationLayer, ChatMiddlewareLayer, BaseChatClient):  # type: ignore[misc]
    """``LiteLLMChatClient.from_settings(settings)``: the agent's model, with tool calling and streaming."""

    OTEL_PROVIDER_NAME = "litellm"

    def __init__(
        self, model: str, request_kwargs: dict[str, Any], num_retries: int = 0, key_note: str | None = None
    ) -> None:
        super().__init__(function_invocation_configuration={"max_iterations": MAX_TOOL_ROUNDS})
        self.model = model
        self._kwargs = request_kwargs  # api_base, api_key, max_tokens, timeout...: never logged or shown
        self._retries = num_retries
        self._key_note = key_note  # why a configured key was not sent to this endpoint

    @classmethod
    def from_settings(cls, settings: Settings) -> LiteLLMChatClient:
        from fleet_rlm.core.lm import build_lm

        lm = build_lm(settings, role="agent")
        kwargs = {k: v for k, v in (lm.kwargs or {}).items() if v is not None}
        return cls(lm.model, kwargs, num_retries=lm.num_retries, key_note=lm.key_note)

    def _inner_get_response(
        self, *, messages: Sequence[Message], stream: bool, options: Mapping[str, Any], **kwargs: Any
    ) -> Any:
        request = {"model": self.model, "messages": to_openai(messages), **self._kwargs}
        tools = [t.to_json_schema_spec() for t in options.get("tools") or [] if hasattr(t, "to_json_schema_spec")]
        if tools:
            request["tools"] = tools
            choice = options.get("tool_choice")
            if isinstance(choice, str) and choice in ("auto", "none", "required"):
                request["tool_choice"] = choice
        if stream:
            return self._build_response_stream(self._stream(request))
        return self._complete(request)

    async def _call(self, request: dict[str, Any], *, stream: bool) -> Any:
        import litellm

        litellm.suppress_debug_info = True  # it would print a help banner on stdout (the MCP stdio channel)
        try:
            return await litellm.acompletion(**request, stream=stream, num_retries=self._retries)
        except Exception as exc:  # one sentence with the fix, secrets masked
            raise explain(exc, self.model, request.get("api_base"), self._key_note) from None

    async def _complete(self, request: dict[str, Any]) -> ChatResponse:
        reply = await self._call(request, stream=False)
        message = reply.choices[0].message
        contents: list[Content] = []
        if message.content:
            contents.append(Content.from_text(message.content))
        for call in message.tool_calls or []:
            contents.append(Content.from_function_call(call.id, call.function.name, arguments=call.function.arguments))
        return ChatResponse(messages=[Message(role="assistant", contents=contents)], model=self.model)

    async def _stream(self, request: dict[str, Any]) -> AsyncIterator[ChatResponseUpdate]:
        """Text as it arrives; tool calls (their arguments come in pieces) once complete, at the end."""
        calls: dict[int, dict[str, str]] = {}
        async for chunk in await self._call(request, stream=True):
            if not chunk.choices:
                continue
            delta = chunk.choices[0].delta
            if getattr(delta, "content", None):
                yield ChatResponseUpdate(role="assistant", contents=[Content.from_text(delta.content)])
            for piece in getattr(delta, "tool_calls", None) or []:
                call = calls.setdefault(piece.index or 0, {"id": "", "name": "", "arguments": ""})
                call["id"] = piece.id or call["id"]
                if piece.function is not None:
                    call["name"] += piece.function.name or ""
                    call["arguments"] += piece.function.arguments or ""
        if calls:
            contents = [
                Content.from_function_call(c["id"] or f"call-{i}", c["name"], arguments=c["arguments"] or "{}")
                for i, c in sorted(calls.items())
            ]
            yield ChatResponseUpdate(role="assistant", contents=contents)


def explain(exc: Exception, model: str, base: str | None, key_note: str | None = None) -> FleetError:
    """A failed model call as one sentence with the fix (LiteLLM's own exception classes)."""
    import litellm

    where = f" at {base}" if base else ""
    first = (str(exc).splitlines() or [type(exc).__name__])[0]
    if isinstance(exc, litellm.AuthenticationError) and key_note:
        message: FleetError = UserError(f"{model}{where} refused the request: {key_note}")
    elif isinstance(exc, litellm.AuthenticationError):
        message = UserError(f"{model}{where} rejected the API key: set FLEET_AGENT_LM_API_KEY (or lm_api_key)")
    elif isinstance(exc, litellm.NotFoundError):
        message = UserError(f"{model}{where} is not a model it serves: check FLEET_AGENT_LM_MODEL")
    elif isinstance(exc, litellm.RateLimitError):
        message = Unavailable(f"{model} is rate limiting requests and retries ran out: wait and try again")
    elif isinstance(exc, litellm.Timeout):
        message = Unavailable(f"{model}{where} timed out: raise FLEET_LM_TIMEOUT or check the server's load")
    elif isinstance(exc, litellm.APIConnectionError) or "Connection error" in first:
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
