"""Model access through ``dspy.LM`` (LiteLLM), metered per call, checked before a run's first step.

Every call's tokens, cost and model reach the caller through a context variable, so usage is
attributed correctly even when many calls run concurrently in one event loop. ``preflight``
catches a wrong model name or a server that is not running in a few seconds, with the fix,
instead of after the first call's retries; ``explain_lm_error`` says the same for failures later.
"""

from __future__ import annotations

import asyncio
import functools
import hashlib
import http.client
import json
import os
import time
import urllib.error
import urllib.request
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
    LMUnsupportedModelError,
)

from fleet_rlm.config import (
    ConfigError,
    Role,
    Settings,
    key_for,
    key_for_model,
    provider_of,
    role_model,
    role_model_and_base,
)
from fleet_rlm.core import tape
from fleet_rlm.core.program import STEP_HEADER
from fleet_rlm.errors import FleetError, Unavailable
from fleet_rlm.redaction import redact_text
from fleet_rlm.types import tokens_of

T = TypeVar("T")
PREFLIGHT_SECONDS = 3.0  # a model server that answers nothing in this time is slow, not absent
MODEL_LIST_BYTES = 8 * 1024 * 1024  # read of a model list at most (OpenRouter's is about 1 MB)
LIST_MODELS = "`curl {base}/models` lists the models it serves"


@dataclass
class CallUsage:
    model: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float | None = None
    latency: float = 0.0
    name: str = ""  # which configured model answered: "root", "sub" or a named one (settings.models)
    replayed: bool = False  # answered from a run's record (core.tape): no model was called, nothing paid
    cached_tokens: int = 0  # prompt tokens the provider read from its prompt cache (part of prompt_tokens)
    cache_write_tokens: int = 0  # prompt tokens written to it (Anthropic bills these above the input rate)
    saved: float = 0.0  # USD the cache saved against pricing every prompt token at the input rate


TOTALS = ("calls", "prompt_tokens", "completion_tokens", "cost", "cached_tokens", "cache_write_tokens", "saved")


@dataclass
class Usage:
    """Totals per model, for a node or a whole run."""

    by_model: dict[str, dict[str, float]] = field(default_factory=dict)
    by_name: dict[str, dict[str, Any]] = field(default_factory=dict)  # the same per configured model: root, sub, fast
    sandbox: dict[str, float] = field(default_factory=dict)  # remote sandbox time and its cost, when billed

    def add(self, call: CallUsage) -> None:
        slot = self.by_model.setdefault(call.model, dict.fromkeys(TOTALS, 0) | {"cost": 0.0, "saved": 0.0})
        slot["calls"] += 1
        slot["prompt_tokens"] += call.prompt_tokens
        slot["completion_tokens"] += call.completion_tokens
        slot["cost"] += call.cost or 0.0
        slot["cached_tokens"] += call.cached_tokens
        slot["cache_write_tokens"] += call.cache_write_tokens
        slot["saved"] += call.saved
        if call.name:
            empty = {"model": call.model} | dict.fromkeys(TOTALS, 0) | {"cost": 0.0, "saved": 0.0}
            named = self.by_name.setdefault(call.name, empty)
            for key in TOTALS:
                named[key] += 1 if key == "calls" else (getattr(call, key) or 0)

    def add_sandbox(self, seconds: float, cost: float) -> None:
        self.sandbox["seconds"] = self.sandbox.get("seconds", 0.0) + seconds
        self.sandbox["cost"] = self.sandbox.get("cost", 0.0) + cost

    @property
    def cost(self) -> float:
        return sum(s["cost"] for s in self.by_model.values())

    @property
    def tokens(self) -> int:
        return sum(tokens_of(s) for s in self.by_model.values())

    def to_dict(self) -> dict[str, Any]:
        totals = {key: sum(s[key] for s in self.by_model.values()) for key in TOTALS}
        report: dict[str, Any] = {"total": totals, "by_model": self.by_model}
        if self.by_name:
            report["by_name"] = self.by_name
        if not self.sandbox:
            return report
        sandbox = {"seconds": round(self.sandbox["seconds"], 3), "cost": round(self.sandbox["cost"], 6)}
        return report | {"sandbox": sandbox}


_sink: ContextVar[list[dict[str, Any]] | None] = ContextVar("fleet_lm_sink", default=None)


class MeteredLM(dspy.LM):
    """A ``dspy.LM`` that hands each call's record to the caller instead of a global list.

    Keeping no history also keeps a long-lived server's memory flat.
    """

    preflight_ok = False  # set by ``preflight`` once the model was found; LMs live as long as their engine
    key_note: str | None = None  # why a configured key was not sent to this endpoint (``config.key_for``)
    price: tuple[float, float] | None = None  # USD per prompt and per reply token set for this model
    mark_cache: bool = False  # mark the transcript's stable prefix cacheable (Anthropic models, FLEET_PROMPT_CACHE)
    name: str = "root"  # the configured model this is: "root", "sub" or a name of settings.models

    def update_history(self, entry: dict[str, Any]) -> None:
        tokens = entry.get("usage") or {}
        entry["cached_tokens"], entry["cache_write_tokens"] = cache_figures(tokens)
        if self.price is not None:  # the user's price wins over LiteLLM's cost map (none for local models)
            prompt, reply = int(tokens.get("prompt_tokens") or 0), int(tokens.get("completion_tokens") or 0)
            entry["cost"] = prompt * self.price[0] + reply * self.price[1]  # cached tokens too: one input price
            entry["saved"] = 0.0
        else:
            entry["saved"] = cache_saving(self.model, entry["cached_tokens"], entry["cache_write_tokens"])
        sink = _sink.get()
        if sink is not None:
            sink.append(entry)

    # A run's record keeps every call's reply and, in a replay or a fork, answers from it (core.tape), keyed
    # by the messages as the program wrote them: the cache marks only go on the wire, and an image part is
    # keyed by its digest (``keyed``). A call carrying images is checked for vision only when it goes out:
    # a replay answers it from the record whatever model is configured now.
    def __call__(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        call = functools.partial(super().__call__, prompt, messages=self._on_wire(messages), **kwargs)

        def live() -> Any:
            self._check_vision(messages)
            return call()

        with self._named():
            return tape.call(*self._request(prompt, messages), live, usage_records(), self._explain)

    async def acall(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        call = functools.partial(super().acall, prompt, messages=self._on_wire(messages), **kwargs)

        async def live() -> Any:
            self._check_vision(messages)
            return await call()

        with self._named():
            return await tape.acall(*self._request(prompt, messages), live, usage_records(), self._explain)

    def _request(self, prompt: Any, messages: Any) -> tuple[Any, Any]:
        """The request as a run's record keys it: a named model's name is part of it, so a replay or fork
        whose code asks another model than the recorded call did diverges there (the root's and the sub
        model's keys stay as they always were: records made before named models still replay)."""
        messages = keyed(messages)
        if self.name in ROLE_NAMES:
            return prompt, messages
        if messages is None:
            return {"model": self.name, "prompt": prompt}, None
        return prompt, [{"role": "model", "content": self.name}, *messages]

    @contextmanager
    def _named(self) -> Iterator[None]:
        """Every usage record this call leaves (live or answered from the record) names this model."""
        records = usage_records()
        mark = len(records) if records is not None else 0
        try:
            yield
        finally:
            for record in records[mark:] if records is not None else ():
                record.setdefault("name", self.name)

    def _check_vision(self, messages: Any) -> None:
        if image_parts(messages):
            refusal = vision_refusal(self.model)
            if refusal:
                raise NoVision(refusal)

    def _on_wire(self, messages: Any) -> Any:
        return mark_cacheable(messages) if self.mark_cache and messages else messages

    def _explain(self, exc: Exception) -> str:
        return explain_lm_error(exc, self)


class NoVision(ConfigError):
    """A call carries images and its model takes none, as LiteLLM's model map says."""


IMAGE_PART = "image_url"  # the chat API's content part LiteLLM translates for every provider


def image_parts(messages: Any) -> int:
    """How many image parts the messages carry (none for a plain prompt or a transcript of text)."""
    if not isinstance(messages, list):
        return 0
    return sum(
        1
        for m in messages
        if isinstance(m, dict) and isinstance(m.get("content"), list)
        for part in m["content"]
        if isinstance(part, dict) and part.get("type") == IMAGE_PART
    )


def keyed(messages: Any) -> Any:
    """The messages as a run's record keys them: each image part by the SHA-256 of its data URL (its mime
    and bytes), so the record never holds pixels and a replay matches the same images, read again."""
    if not image_parts(messages):
        return messages
    return [{**m, "content": [_digest(p) for p in m["content"]]} if isinstance(m.get("content"), list) else m
            for m in messages]  # fmt: skip


def _digest(part: Any) -> Any:
    if not (isinstance(part, dict) and part.get("type") == IMAGE_PART):
        return part
    image = part.get(IMAGE_PART)
    url = image.get("url", "") if isinstance(image, dict) else str(image)
    return {"type": IMAGE_PART, "sha256": hashlib.sha256(str(url).encode("utf-8", "surrogatepass")).hexdigest()}


def vision_refusal(model: str) -> str | None:
    """Why ``model`` cannot take images, when LiteLLM's model map lists it without vision; None when the map
    says it can, or does not know the model (a local server's, a new one): then its provider has the last word."""
    info = _cost_entry(model)
    if not info or info.get("supports_vision"):
        return None
    return (
        f"the sub model {model} does not take images (LiteLLM's model map lists it without vision): set "
        "FLEET_SUB_LM_MODEL to a vision model, e.g. openai/gpt-4o-mini, anthropic/claude-sonnet-4-5 or "
        "gemini/gemini-2.5-flash, or ask without images"
    )


def _detail(holder: Any, name: str) -> Any:
    """A usage field, from a dict or from LiteLLM's usage objects alike."""
    return holder.get(name) if isinstance(holder, dict) else getattr(holder, name, None)


def cache_figures(tokens: Any) -> tuple[int, int]:
    """(read from, written to) the provider's prompt cache, in prompt tokens, however it reported them:
    OpenAI's and Gemini's ``prompt_tokens_details.cached_tokens``, Anthropic's ``cache_read_input_tokens``
    and ``cache_creation_input_tokens`` (LiteLLM keeps both forms; dspy's native engine the first)."""
    details = _detail(tokens, "prompt_tokens_details") or {}
    read = _detail(details, "cached_tokens") or _detail(tokens, "cache_read_input_tokens")
    written = _detail(details, "cache_creation_tokens") or _detail(tokens, "cache_creation_input_tokens")
    return int(read or 0), int(written or 0)


@functools.lru_cache(maxsize=64)
def _cost_entry(model: str) -> dict[str, Any]:
    """The model's entry in LiteLLM's cost map, as dspy ships it and prices its own calls by, read without
    importing LiteLLM (seconds of CPU at a run's start); empty when the map does not list it. Only a bare
    name asks LiteLLM, which alone knows the provider it means (and serves its calls anyway)."""
    provider, slash, name = model.partition("/")
    if slash:
        from dspy.clients.model_metadata import model_info

        return dict(model_info(provider, name))
    import litellm

    try:
        return dict(litellm.get_model_info(model))
    except Exception:  # not in the map
        return {}


def _cache_rates(model: str) -> tuple[float, float, float] | None:
    """USD per input token, per cache-read token and per cache-write token in LiteLLM's cost map; a cache
    rate it lacks is the input rate (nothing saved). None: the model has no price there."""
    info = _cost_entry(model)
    base = info.get("input_cost_per_token")
    if not base:
        return None
    read = info.get("cache_read_input_token_cost")
    written = info.get("cache_creation_input_token_cost")
    return float(base), float(base if read is None else read), float(base if written is None else written)


def cache_saving(model: str, read: int, written: int) -> float:
    """USD the prompt cache saved on one call: its cached tokens priced at the input rate, less what they
    cost; Anthropic's cache writes cost more than input, so a call that only writes saves a negative sum."""
    rates = _cache_rates(model) if read or written else None
    if rates is None:
        return 0.0
    base, read_rate, write_rate = rates
    return read * (base - read_rate) + written * (base - write_rate)


def _text_blocks(content: Any) -> list[dict[str, Any]] | None:
    """A message's content as text blocks split at each transcript step, or None when it is not plain text."""
    if not isinstance(content, str):
        return None
    pieces = content.split(STEP_HEADER)
    texts = pieces[:1] + [STEP_HEADER + piece for piece in pieces[1:]]
    return [{"type": "text", "text": text} for text in texts if text]


def mark_cacheable(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``messages`` with Anthropic's cache mark at the end of the transcript's stable part: the last user
    message is split into one block per step and the block before the last is marked. The transcript only
    grows at its end, so the next call repeats that block verbatim and Anthropic, which matches cached
    prefixes at block boundaries, reads everything up to it from the cache. The first step has no stable
    block yet and goes unmarked."""
    last = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    if last is None:
        return messages
    blocks = _text_blocks(messages[last].get("content"))
    if not blocks or len(blocks) < 2:
        return messages
    blocks[-2]["cache_control"] = {"type": "ephemeral"}
    return [*messages[:last], {**messages[last], "content": blocks}, *messages[last + 1 :]]


def usage_records() -> list[dict[str, Any]] | None:
    """Where the call in progress hands its usage records (``metered``'s list), if anyone collects them."""
    return _sink.get()


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
    last = records[-1]
    usage = CallUsage(model=str(last.get("model") or ""), latency=latency, name=str(last.get("name") or ""))
    usage.replayed = all(rec.get("replayed") for rec in records)
    cost = 0.0
    for rec in records:
        tokens = rec.get("usage") or {}
        usage.prompt_tokens += int(tokens.get("prompt_tokens") or 0)
        usage.completion_tokens += int(tokens.get("completion_tokens") or 0)
        usage.cached_tokens += int(rec.get("cached_tokens") or 0)
        usage.cache_write_tokens += int(rec.get("cache_write_tokens") or 0)
        usage.saved += float(rec.get("saved") or 0.0)
        cost += float(rec.get("cost") or 0.0)
    usage.cost = cost or None
    return usage


def build_lm(settings: Settings, *, role: Role = "root") -> MeteredLM:
    """The LM of ``role``: the root, the sub model of llm_query or the workspace agent, each unset
    part of the latter two from the root's. Its key is the one bound to its endpoint, if any."""
    model, api_base = role_model(settings, role)
    key = key_for(settings, role)
    api_key = key.value
    if api_base and not api_key:
        # Local OpenAI-compatible servers (Ollama, vLLM) ignore it, and LiteLLM then sends no key
        # of its own finding (OPENAI_API_KEY) to a base it was not given for.
        api_key = "not-needed"
    try:
        lm = MeteredLM(
            model,
            api_base=api_base,
            api_key=api_key,
            cache=False,
            num_retries=settings.lm_retries,
            max_tokens=settings.lm_max_tokens,
            timeout=settings.lm_timeout,
        )
    except (ValueError, LMConfigurationError) as exc:  # e.g. reasoning models refuse a small max_tokens
        blame = " (FLEET_LM_MAX_TOKENS)" if "max_tokens" in str(exc) else ""
        raise ConfigError(redact_text(f"{model} cannot be used with these settings{blame}: {exc}")) from None
    lm.key_note = key.note
    lm.price = _price(settings, role)
    lm.mark_cache = settings.prompt_cache and role == "root" and _is_anthropic(model)
    lm.name = role
    return lm


ROLE_NAMES = ("root", "sub", "agent")


def build_named_lm(settings: Settings, name: str) -> MeteredLM:
    """Named model ``name`` of ``settings.models``, with the key bound to its own endpoint (``key_for_model``).
    No price setting: LiteLLM's cost map prices it, when it knows the model."""
    spec = settings.models[name]
    key = key_for_model(settings, name)
    api_key = key.value or ("not-needed" if spec.api_base else None)  # never another endpoint's key (build_lm)
    try:
        lm = MeteredLM(
            spec.model,
            api_base=spec.api_base,
            api_key=api_key,
            cache=False,
            num_retries=settings.lm_retries,
            max_tokens=settings.lm_max_tokens,
            timeout=settings.lm_timeout,
        )
    except (ValueError, LMConfigurationError) as exc:
        refusal = f"model {name!r} ({spec.model}) cannot be used with these settings: {exc}"
        raise ConfigError(redact_text(refusal)) from None
    lm.key_note = key.note
    lm.name = name
    return lm


def _is_anthropic(model: str) -> bool:
    """Whether LiteLLM sends ``model`` to Anthropic's API, the one that caches by marks on message blocks.
    Read from the model string's prefix: importing LiteLLM for it would hold up a run's first call by
    several times dspy's own import (only a bare name, such as claude-sonnet-4-5, needs LiteLLM)."""
    return provider_of(model) == "anthropic"


PRICE_PREFIX: dict[Role, str] = {"root": "lm", "sub": "sub_lm"}  # the agent's own calls are not metered


def _price(settings: Settings, role: Role) -> tuple[float, float] | None:
    """USD per prompt and per reply token set for ``role``'s model: its own two settings, else the root's
    when it runs the root's model. None: LiteLLM's cost map prices it, if it knows the model."""
    own = _price_setting(settings, PRICE_PREFIX.get(role))
    if own is not None or role == "root":
        return own
    runs_root_model = role_model_and_base(dict(settings), role)[0] == settings.lm_model
    return _price_setting(settings, "lm") if runs_root_model else None


def _price_setting(settings: Settings, prefix: str | None) -> tuple[float, float] | None:
    if prefix is None:
        return None
    given_in = getattr(settings, f"{prefix}_price_per_mtok_in")
    given_out = getattr(settings, f"{prefix}_price_per_mtok_out")
    if given_in is None or given_out is None:  # a price needs both: half of one would undercount
        return None
    return float(given_in) / 1e6, float(given_out) / 1e6


def has_price(lm: MeteredLM) -> bool:
    """Whether a call's cost is known: a price set for the model, or one above zero in LiteLLM's cost map
    (local models are missing there or listed at zero, so their calls would count as $0)."""
    if lm.price is not None:
        return True
    info = _cost_entry(lm.model)
    return bool(info.get("input_cost_per_token") or info.get("output_cost_per_token"))


def check_cost_cap(max_cost: float | None, root: MeteredLM, sub: MeteredLM) -> None:
    """Refuse, before any model call, a cost cap a run could not enforce: one of its models has no known
    price, so its calls would count as $0 and the cap would never be reached."""
    if max_cost is None:
        return
    runs: tuple[tuple[MeteredLM, Role], ...] = ((root, "root"), (sub, "sub"))
    for lm, role in runs:
        if not has_price(lm):
            prefix, which = PRICE_PREFIX[role], "the sub model " if role == "sub" else ""
            raise ConfigError(
                f"a cost cap of ${max_cost:g} cannot be enforced: {which}{lm.model} has no known price, so its "
                f"calls would count as $0; set {prefix}_price_per_mtok_in and {prefix}_price_per_mtok_out (USD per "
                "million tokens), or cap model calls with max_llm_calls instead of max_cost."
            )


async def preflight(*lms: MeteredLM) -> list[str]:
    """Check once per LM, before a run's first step, that its model exists where it is asked for;
    returns warnings, one line each, for the run to show.

    Raises ``Unavailable`` (nothing answers at the address) or ``ConfigError`` (unknown model, key
    refused), each one sentence with the fix. With an ``api_base`` (an OpenAI-compatible server)
    the check reads ``GET {base}/models``; a model it lists passes with no model call. One it does
    not list is refused only on a definite no: Ollama's list is exactly what it serves, anything
    else gets a 5-token call without retries, refused if the server rejects the name; otherwise
    a warning (llama.cpp's server and wildcard proxies answer any name). Without a base, the
    provider gets that 5-token call. Anything less clear than a definite no (no /models route, a
    slow or busy server) passes: the run's own call, with its retries, has the last word. Success
    is remembered on the LM; the engine builds its LMs once, so this runs once per engine and model."""
    checked: set[tuple[str, Any]] = set()
    warnings: list[str] = []
    for lm in lms:
        key = (lm.model, (lm.kwargs or {}).get("api_base"))
        if key in checked:  # the sub LM is often the root's model: found with it
            lm.preflight_ok = True
        if lm.preflight_ok:
            continue
        base = key[1]
        if base:
            warnings += await _check_served(lm, str(base).rstrip("/"))
        else:
            await _check_call(lm)
        lm.preflight_ok = True
        checked.add(key)
    return warnings


# Servers whose model list is exactly what they answer to (Ollama serves the models pulled).
STRICT_PROVIDERS = frozenset({"ollama", "ollama_chat"})


async def _check_served(lm: MeteredLM, base: str) -> list[str]:
    served = await _served_models(lm, base)
    provider, _, name = lm.model.partition("/")
    if not served or {lm.model, name, f"{name}:latest"} & set(served):
        return []
    shown = ", ".join(served[:8]) + (f" and {len(served) - 8} more" if len(served) > 8 else "")
    refusal = ConfigError(
        redact_text(
            f"{base} serves no model '{name}' ({lm.model}): it serves {shown}; set FLEET_LM_MODEL "
            f"to one of them with its provider prefix ({LIST_MODELS.format(base=base)})."
        )
    )
    if provider in STRICT_PROVIDERS:
        raise refusal
    try:
        await _tiny_call(lm)
    except LMUnsupportedModelError:
        raise refusal from None
    except LMAuthError:
        raise ConfigError(_key_refused(lm, f" at {base}")) from None
    except Exception:  # slow, busy, or a setting the tiny call trips on: the run's first call decides
        pass
    listing = f"{base} does not list '{name}' (it lists {shown})"
    return [redact_text(f"{listing}; using it anyway, as servers that answer any name (llama.cpp, proxies) allow")]


async def _served_models(lm: MeteredLM, base: str) -> list[str]:
    """The names ``GET {base}/models`` lists; empty when it lists nothing usable (no such route)."""
    key = (lm.kwargs or {}).get("api_key")
    headers = {"Authorization": f"Bearer {key}"} if key and key != "not-needed" else {}
    try:
        status, body = await asyncio.to_thread(_get, f"{base}/models", headers)
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, TimeoutError) or not isinstance(exc.reason, OSError):  # slow, or no such URL form
            return []  # let the real call tell
        raise Unavailable(
            f"cannot reach {lm.model}: nothing answers at {base}; is the server running? (check FLEET_LM_API_BASE)"
        ) from None
    except (OSError, http.client.HTTPException, ValueError):  # slow, or speaking something else
        return []
    if status in (401, 403):
        raise ConfigError(_key_refused(lm, f" at {base}"))
    try:
        return [str(m["id"]) for m in json.loads(body)["data"]] if status == 200 else []
    except (ValueError, KeyError, TypeError):
        return []


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    """A redirect comes back as its status: followed, it would carry the model key to another address."""

    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None


_OPENER = urllib.request.build_opener(_NoRedirect)


def _get(url: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """A GET's status and body (an error status's body left out). The standard library, as dspy's own
    client uses: httpx would add its import to the time before a run's first model call."""
    request = urllib.request.Request(url, headers=headers)
    try:
        with _OPENER.open(request, timeout=PREFLIGHT_SECONDS) as reply:
            return reply.status, reply.read(MODEL_LIST_BYTES)
    except urllib.error.HTTPError as exc:
        exc.close()
        return exc.code, b""


async def _tiny_call(lm: MeteredLM) -> None:
    """A 5-token call without retries: the cheapest question a provider answers with a verdict."""
    probe = lm.copy(num_retries=0, timeout=PREFLIGHT_SECONDS)
    await probe.acall(prompt="Reply with the word OK.", max_tokens=5)


async def _check_call(lm: MeteredLM) -> None:
    try:
        await _tiny_call(lm)
    except (LMAuthError, LMUnsupportedModelError, LMConfigurationError) as exc:
        raise ConfigError(explain_lm_error(exc, lm)) from None
    except LMTransportError as exc:
        raise Unavailable(explain_lm_error(exc, lm)) from None
    except Exception:  # timeouts, rate limits, provider hiccups: not a verdict on the settings
        return


def _key_refused(lm: dspy.LM | None, where: str) -> str:
    model = getattr(lm, "model", "the model")
    note = getattr(lm, "key_note", None)
    if note:  # the server wanted a key, and the one configured is for another endpoint
        return f"{model}{where} refused the request: {note}."
    return f"{model}{where} rejected the API key: set a valid FLEET_LM_API_KEY (or `fleet-rlm config set lm_api_key`)."


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
    if isinstance(exc, FleetError):  # written for the user already (preflight)
        return exc.message
    if isinstance(exc, LMUnsupportedModelError):
        listing = f" ({LIST_MODELS.format(base=base)})" if base else ""
        return f"{model}{where} is not a model it knows: check FLEET_LM_MODEL{listing}."
    if isinstance(exc, LMAuthError) or (isinstance(exc, LMConfigurationError) and getattr(lm, "key_note", None)):
        return _key_refused(lm, where)
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
