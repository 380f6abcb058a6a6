"""Model access through ``dspy.LM`` (LiteLLM), metered per call.

Every call's tokens, cost and model reach the caller through a context variable, so usage is
attributed correctly even when many calls run concurrently in one event loop.
"""

from __future__ import annotations

import os
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, TypeVar

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import

import dspy
from dspy.utils.exceptions import (
    ContextWindowExceededError,
    LMAuthError,
    LMConfigurationError,
    LMError,
    LMRateLimitError,
    LMTimeoutError,
    LMTransportError,
)

from fleet_rlm.config import ConfigError, Settings
from fleet_rlm.redaction import redact_text

T = TypeVar("T")


@dataclass
class CallUsage:
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    latency: float = 0.0


@dataclass
class Usage:
    """Totals per model, for a node or a whole run."""

    by_model: dict[str, dict[str, float]] = field(default_factory=dict)

    def add(self, call: CallUsage) -> None:
        slot = self.by_model.setdefault(
            call.model, {"calls": 0, "prompt_tokens": 0, "completion_tokens": 0, "cost": 0.0}
        )
        slot["calls"] += 1
        slot["prompt_tokens"] += call.prompt_tokens
        slot["completion_tokens"] += call.completion_tokens
        slot["cost"] += call.cost or 0.0

    @property
    def cost(self) -> float:
        return sum(s["cost"] for s in self.by_model.values())

    @property
    def tokens(self) -> int:
        return int(sum(s["prompt_tokens"] + s["completion_tokens"] for s in self.by_model.values()))

    def to_dict(self) -> dict[str, Any]:
        totals = {
            key: sum(s[key] for s in self.by_model.values())
            for key in ("calls", "prompt_tokens", "completion_tokens", "cost")
        }
        return {"total": totals, "by_model": self.by_model}


_sink: ContextVar[list[dict[str, Any]] | None] = ContextVar("fleet_lm_sink", default=None)


class MeteredLM(dspy.LM):
    """A ``dspy.LM`` that hands each call's record to the caller instead of a global list.

    Keeping no history also keeps a long-lived server's memory flat.
    """

    def update_history(self, entry: dict[str, Any]) -> None:
        sink = _sink.get()
        if sink is not None:
            sink.append(entry)


@contextmanager
def _collect() -> Iterator[list[dict[str, Any]]]:
    records: list[dict[str, Any]] = []
    token = _sink.set(records)
    try:
        yield records
    finally:
        _sink.reset(token)


async def metered(
    call: Callable[[], Awaitable[T]], on_usage: Callable[[CallUsage], None] | None = None
) -> tuple[T, CallUsage | None]:
    """Run one LM-calling coroutine and return its result with the usage it recorded.

    ``on_usage`` sees the usage even when the call then fails (a reply that could not be
    parsed was still paid for)."""
    started = time.perf_counter()
    usage: CallUsage | None = None
    with _collect() as records:
        try:
            result = await call()
        finally:
            usage = _sum(records, time.perf_counter() - started)
            if usage is not None and on_usage is not None:
                on_usage(usage)
    return result, usage


def _sum(records: list[dict[str, Any]], latency: float) -> CallUsage | None:
    if not records:
        return None
    usage = CallUsage(model=str(records[-1].get("model") or ""), latency=latency)
    cost = 0.0
    for rec in records:
        tokens = rec.get("usage") or {}
        usage.prompt_tokens += int(tokens.get("prompt_tokens") or 0)
        usage.completion_tokens += int(tokens.get("completion_tokens") or 0)
        cost += float(rec.get("cost") or 0.0)
    usage.cost = cost or None
    return usage


def _secret(value: Any) -> str | None:
    return value.get_secret_value() if value is not None else None


def build_lm(settings: Settings, *, sub: bool = False) -> MeteredLM:
    """The root LM, or the sub LM (which falls back to the root's model, base and key)."""
    model = (settings.sub_lm_model if sub else None) or settings.lm_model
    if not model:
        raise ConfigError(
            "No model configured: set FLEET_LM_MODEL to a LiteLLM model string "
            "(e.g. openai/gpt-4o-mini, anthropic/claude-sonnet-4-5, ollama_chat/llama3.1), "
            "or run `fleet-rlm config set lm_model <model>`."
        )
    api_base = (settings.sub_lm_api_base if sub else None) or settings.lm_api_base
    api_key = (_secret(settings.sub_lm_api_key) if sub else None) or _secret(settings.lm_api_key)
    if api_base and not api_key:
        api_key = "not-needed"  # local OpenAI-compatible servers (Ollama, vLLM) ignore the key
    try:
        return MeteredLM(
            model,
            api_base=api_base,
            api_key=api_key,
            cache=False,
            num_retries=settings.lm_retries,
            max_tokens=settings.lm_max_tokens,
            timeout=settings.lm_timeout,
        )
    except (ValueError, LMConfigurationError) as exc:  # e.g. reasoning models refuse a small max_tokens
        raise ConfigError(
            redact_text(f"{model} cannot be used with these settings (FLEET_LM_MAX_TOKENS?): {exc}")
        ) from None


def explain_lm_error(exc: BaseException, lm: dspy.LM | None = None) -> str:
    """One sentence that says what went wrong with the model and how to fix it.

    Secrets are masked: providers' error texts may echo the request's key or headers, and this
    sentence reaches run errors, events, MCP replies and the sandbox's code."""
    return redact_text(_explain(exc, lm))


def _explain(exc: BaseException, lm: dspy.LM | None) -> str:
    model = getattr(lm, "model", "the model")
    base = (getattr(lm, "kwargs", {}) or {}).get("api_base")
    where = f" at {base}" if base else ""
    first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
    if isinstance(exc, LMAuthError):
        return (
            f"{model}{where} rejected the API key: set a valid FLEET_LM_API_KEY (or `fleet-rlm config set lm_api_key`)."
        )
    if isinstance(exc, LMTransportError):
        return f"cannot reach {model}{where} ({first}): check FLEET_LM_API_BASE and that the server is running."
    if isinstance(exc, LMRateLimitError):
        return f"{model} is rate limiting requests and retries ran out: wait, or lower FLEET_CONCURRENCY."
    if isinstance(exc, LMTimeoutError):
        return f"{model}{where} timed out: raise FLEET_LM_TIMEOUT or check the server's load."
    if isinstance(exc, ContextWindowExceededError):
        return f"the prompt exceeded {model}'s context window: ask for smaller pieces."
    if isinstance(exc, LMConfigurationError):
        return f"{model} is not configured ({first}): set FLEET_LM_API_KEY or FLEET_LM_API_BASE."
    if isinstance(exc, LMError):
        return f"{model}{where} failed: {first}"
    return f"{type(exc).__name__}: {first}"
