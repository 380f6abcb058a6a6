"""Settings: environment (``FLEET_*``), then the OS keyring for secrets, then ``.env``, then
the user's ``settings.json`` under ``FLEET_HOME``.

Secrets are ``SecretStr`` and live only in the environment or the keyring: ``fleet-rlm config
set`` refuses to write them to a file, and every value loaded is registered with
``fleet_rlm.redaction`` so it is masked wherever it would appear. A model key goes only to the
endpoint it was given for (``key_for``). ``FLEET_HOME`` and the files
fleet-rlm writes there are private to the user (0700 folders, 0600 files). Keep this module
light: ``--help`` imports it.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    AliasChoices,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    SecretStr,
    field_validator,
    model_validator,
)
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    DotEnvSettingsSource,
    EnvSettingsSource,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from fleet_rlm.errors import UserError
from fleet_rlm.limits import MAX_COST, MAX_DEPTH, MAX_ITERS, MAX_LLM_CALLS, MAX_SECONDS, MAX_TOKENS
from fleet_rlm.redaction import remember_secrets

KEYRING_SERVICE = "fleet-rlm"
SECRET_FIELDS = ("lm_api_key", "sub_lm_api_key", "daytona_api_key", "mcp_token", "agent_lm_api_key")

Role = Literal["root", "sub", "agent"]
# Each model role's settings: its model, its base URL and its key.
ROLE_FIELDS: dict[Role, tuple[str, str, str]] = {
    "root": ("lm_model", "lm_api_base", "lm_api_key"),
    "sub": ("sub_lm_model", "sub_lm_api_base", "sub_lm_api_key"),
    "agent": ("agent_lm_model", "agent_lm_api_base", "agent_lm_api_key"),
}


def default_home() -> Path:
    return Path(os.environ.get("FLEET_HOME") or Path.home() / ".fleet-rlm").expanduser()


def user_settings_path() -> Path:
    return default_home() / "settings.json"


def private_dir(path: Path) -> Path:
    """Create ``path`` (and missing parents) readable by this user only (0700); return it.

    An existing folder of ours loses group/other access too, unless it is a shared sticky
    folder such as /tmp, which must stay as it is."""
    path.mkdir(mode=0o700, parents=True, exist_ok=True)  # mode applies to the last part only
    info = path.stat()
    if info.st_uid == os.getuid() and not info.st_mode & stat.S_ISVTX and info.st_mode & 0o077:
        path.chmod(stat.S_IMODE(info.st_mode) & 0o700)
    return path


# -- where a model's requests, and so its key, go -----------------------------------------------

_DEFAULT_PORTS = {"http": 80, "https": 443}


@dataclass(frozen=True)
class Endpoint:
    """Where a model's requests go: its base URL, or the provider's own endpoint when it has none.

    The provider counts only without a base: with one, the base is the host whatever the provider,
    and without one, a different provider is a different host (another company, or a local port)."""

    base: str | None = None
    provider: str | None = None

    def __str__(self) -> str:
        return self.base or f"{self.provider}'s own endpoint"

    def to_json(self) -> str:
        return json.dumps({"base": self.base, "provider": self.provider})

    @classmethod
    def from_json(cls, text: str | None) -> Endpoint | None:
        try:
            data = json.loads(text or "")
            return cls(base=data.get("base"), provider=data.get("provider"))
        except (ValueError, AttributeError):
            return None


def normalise_base(url: str) -> str:
    """One spelling per server: scheme and host lower-cased, no default port, no trailing slash."""
    from urllib.parse import urlsplit, urlunsplit

    text = url.strip()
    try:
        parts = urlsplit(text)
        port = parts.port
    except ValueError:  # not a URL we can take apart: compared as written
        return text.rstrip("/")
    scheme = parts.scheme.lower()
    host = parts.hostname or ""
    host = f"[{host}]" if ":" in host else host
    if port is not None and _DEFAULT_PORTS.get(scheme) != port:
        host += f":{port}"
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@{host}" if userinfo else host
    return urlunsplit((scheme, netloc, parts.path.rstrip("/"), parts.query, parts.fragment))


def provider_of(model: str) -> str:
    """The LiteLLM provider a model string routes to: its prefix (openai/gpt-4o-mini: openai)."""
    prefix, slash, _ = model.strip().partition("/")
    if slash:
        return prefix.strip().lower()
    # unknown to LiteLLM: a provider of its own, equal only to itself
    return _litellm_provider(model.strip()) or model.strip().lower()


def _litellm_provider(bare: str) -> str | None:
    """The provider LiteLLM routes a bare model name (gpt-4o-mini) to, None if it knows none. LiteLLM
    takes seconds to import: only bare names ask it."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")  # no network fetch at import
    try:
        import litellm

        litellm.suppress_debug_info = True  # it would print a provider list on stdout
        return str(litellm.get_llm_provider(bare)[1])
    except Exception:
        return None


def role_model_and_base(values: Mapping[str, Any], role: Role) -> tuple[str | None, str | None]:
    """The model and base URL ``role`` uses: its own, else the root's (the agent's own model keeps
    no root base: it names its own provider)."""
    model, base = values.get("lm_model"), values.get("lm_api_base")
    if role == "root":
        return model, base
    own_model, own_base, _ = ROLE_FIELDS[role]
    inherited = base if role == "sub" or not values.get(own_model) else None
    return values.get(own_model) or model, values.get(own_base) or inherited


def role_model(settings: Settings, role: Role) -> tuple[str, str | None]:
    """The model and base URL ``role`` uses; refused with the fix when there is no model or LiteLLM
    could not route its name, so that a run fails here and not at its first call."""
    model, base = role_model_and_base(dict(settings), role)
    if not model:
        raise NoModelConfigured(
            "No model configured: set FLEET_LM_MODEL to a LiteLLM model string "
            "(e.g. openai/gpt-4o-mini, anthropic/claude-sonnet-4-5, ollama_chat/llama3.1), "
            "or run `fleet-rlm config set lm_model <model>`."
        )
    provider, slash, name = model.strip().partition("/")
    # a bare name works only where LiteLLM knows which provider serves it (gpt-4o-mini)
    routable = bool(provider.strip() and name.strip()) if slash else _litellm_provider(model) is not None
    if not routable:
        own_model = ROLE_FIELDS[role][0]
        setting = env_name(own_model if getattr(settings, own_model) else "lm_model")
        raise ConfigError(
            f"{setting}={model!r} needs a provider and a model name, as in openai/gpt-4o-mini or "
            "ollama_chat/llama3.1 (https://docs.litellm.ai/docs/providers lists the providers)."
        )
    return model, base


def endpoint_of(values: Mapping[str, Any], role: Role) -> Endpoint | None:
    """Where ``role``'s requests go under ``values`` (settings, or one source's values); None: no model."""
    model, base = role_model_and_base(values, role)
    if base:
        return Endpoint(base=normalise_base(base))
    return Endpoint(provider=provider_of(model)) if model else None


MODEL_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_-]{0,39}")


class ModelSpec(BaseModel):
    """A named model for sub-calls (``llm_query(prompt, model=NAME)``): a LiteLLM model string with
    its own base URL and key. The key goes only to this spec's endpoint, as it was given in the
    environment or .env (``key_for_model``); it is never saved to a file."""

    model_config = ConfigDict(extra="forbid")

    model: str = Field(description="A LiteLLM model string (openai/gpt-4o-mini).")
    api_base: str | None = Field(None, description="OpenAI-compatible base URL of its server.")
    api_key: SecretStr | None = Field(None, description="API key for this model's endpoint only.")

    @field_validator("model")
    @classmethod
    def _routable(cls, value: str) -> str:
        provider, slash, name = value.strip().partition("/")
        if not (slash and provider.strip() and name.strip()):
            raise ValueError(f"{value!r} needs a provider and a model name, as in openai/gpt-4o-mini")
        return value.strip()


def named_endpoint(spec: Mapping[str, Any] | ModelSpec) -> Endpoint | None:
    """Where a named model's requests go: its base URL, else its provider's own endpoint."""
    values = spec.model_dump() if isinstance(spec, ModelSpec) else spec
    if not isinstance(values, Mapping) or not values.get("model"):
        return None
    base = values.get("api_base")
    return Endpoint(base=normalise_base(base)) if base else Endpoint(provider=provider_of(str(values["model"])))


@dataclass(frozen=True)
class BoundKey:
    """A model key with the one endpoint it may be sent to (None: none) and where it was found."""

    value: SecretStr
    endpoint: Endpoint | None
    origin: str


class McpServerSpec(BaseModel):
    """One MCP server whose tools a run may mount in its REPL (core.tools), in the shape of Claude
    Code's ``.mcp.json`` entries: ``{"command", "args", "env"}`` (stdio) or ``{"type": "http", "url",
    "headers"}``. Header and environment values are secrets: masked everywhere, never shown."""

    model_config = ConfigDict(extra="ignore")

    type: Literal["stdio", "http"] = Field("stdio", description="stdio (a command) or http (a URL).")
    command: str | None = Field(None, description="The program that serves MCP over stdio.")
    args: list[str] = Field(default_factory=list)
    env: dict[str, SecretStr] = Field(default_factory=dict, description="Its environment (values are secrets).")
    cwd: str | None = None
    url: str | None = Field(None, description="The Streamable HTTP endpoint (http type).")
    headers: dict[str, SecretStr] = Field(default_factory=dict, description="Request headers (values are secrets).")

    @model_validator(mode="before")
    @classmethod
    def _kind(cls, value: Any) -> Any:
        if isinstance(value, Mapping) and "type" not in value and value.get("url") and not value.get("command"):
            return {**value, "type": "http"}
        return value

    @model_validator(mode="after")
    def _complete(self) -> McpServerSpec:
        if self.type == "stdio" and not self.command:
            raise ValueError('a stdio MCP server needs a "command"')
        if self.type == "http" and not (self.url or "").startswith(("http://", "https://")):
            raise ValueError('an http MCP server needs a "url" starting with http:// or https://')
        remember_secrets([v.get_secret_value() for v in (*self.env.values(), *self.headers.values())])
        return self


class Settings(BaseSettings):
    """Every knob of the runtime; names map to env vars ``FLEET_<NAME>``."""

    model_config = SettingsConfigDict(
        # An empty variable (templated client configs pass "") must not hide a keyring secret.
        env_prefix="FLEET_",
        env_file=".env",
        extra="ignore",
        populate_by_name=True,
        env_ignore_empty=True,
    )

    home: Path = Field(default_factory=default_home, description="Data folder: store, volumes, work dirs.")
    lm_model: str | None = Field(None, description="Root model, a LiteLLM model string (openai/gpt-4o-mini).")
    lm_api_base: str | None = Field(None, description="OpenAI-compatible base URL (Ollama, vLLM, LM Studio).")
    lm_api_key: SecretStr | None = Field(None, description="API key for the root model.")
    sub_lm_model: str | None = Field(None, description="Model for llm_query; defaults to the root model.")
    sub_lm_api_base: str | None = Field(None, description="Base URL for the sub model.")
    sub_lm_api_key: SecretStr | None = Field(None, description="API key for the sub model.")
    lm_max_tokens: int | None = Field(None, ge=1, description="Max tokens per reply; unset: the provider's.")
    lm_retries: int = Field(3, ge=0, le=10, description="Retries on 429/5xx/timeouts, with backoff.")
    lm_timeout: float = Field(120.0, gt=0, description="Seconds before one model call times out.")
    # Prices for models LiteLLM has none for (local servers), so max_cost can be enforced; both or neither.
    lm_price_per_mtok_in: float | None = Field(
        None, ge=0, description="USD per million prompt tokens of the root model; set: used instead of LiteLLM's."
    )
    lm_price_per_mtok_out: float | None = Field(
        None, ge=0, description="USD per million reply tokens of the root model; set: used instead of LiteLLM's."
    )
    sub_lm_price_per_mtok_in: float | None = Field(
        None, ge=0, description="USD per million prompt tokens of the sub model; unset: the root's, for its model."
    )
    sub_lm_price_per_mtok_out: float | None = Field(
        None, ge=0, description="USD per million reply tokens of the sub model; unset: the root's, for its model."
    )
    models: dict[str, ModelSpec] = Field(
        default_factory=dict,
        description='Named models for sub-calls, llm_query(prompt, model=NAME): JSON such as {"fast": {"model": '
        '"openai/gpt-4o-mini", "api_base": null}}; an api_key is given only in FLEET_MODELS (environment or .env).',
    )
    prompt_cache: bool = Field(
        True, description="Mark the root transcript's stable prefix cacheable for Anthropic models (cache_control)."
    )

    sandbox: str = Field("local", description="Where code runs: a sandbox backend (local or daytona).")
    isolation: Literal["auto", "bwrap", "none"] = Field("auto", description="Local sandbox isolation.")
    exec_timeout: float = Field(300.0, gt=0, description="Seconds one code step may run.")
    memory_mb: int = Field(2048, ge=64, description="Memory cap of the whole sandbox (all its processes), MB.")
    max_procs: int = Field(64, ge=1, description="Processes and threads sandboxed code may run at once.")
    output_chars: int = Field(10_000, ge=200, description="Output of one step the model sees (head+tail).")
    work_quota_mb: int = Field(
        1024, ge=1, description="Disk use of a sandbox's work folder (/fleet/work), MB; a step past it is trimmed."
    )
    work_max_files: int = Field(
        100_000, ge=1, description="Entries (files, folders, links) in a sandbox's work folder."
    )
    host_call_mb: int = Field(
        128, ge=1, description="Host-call data (prompts, contexts) one sandbox may have on the host at once, MB."
    )
    host_call_total_mb: int = Field(
        512, ge=1, description="Host-call data all sandboxes of this process may have on the host at once, MB."
    )
    subcall_max_chars: int = Field(
        4_000_000, ge=1, description="Longest llm_query prompt, characters; a longer one fails in the REPL, unsent."
    )
    # Runs longer than a window (core/compaction.py): unset, LiteLLM's model info says the window.
    lm_context_window: int | None = Field(
        None, ge=256, description="Root model's context window, tokens (local servers); unset: LiteLLM's figure."
    )
    sub_lm_context_window: int | None = Field(
        None, ge=256, description="Sub model's context window, tokens; a larger llm_query prompt fails in the REPL."
    )
    compact_at: float = Field(
        0.85, gt=0, lt=1, description="Share of the root model's window at which the transcript is compacted."
    )

    # Bounds, defaults and descriptions from the one declaration of the run limits (fleet_rlm/limits.py).
    max_iters: int = Field(MAX_ITERS.default, **MAX_ITERS.pydantic_bounds(), description=f"{MAX_ITERS.meaning}.")
    max_llm_calls: int = Field(
        MAX_LLM_CALLS.default, **MAX_LLM_CALLS.pydantic_bounds(), description=f"{MAX_LLM_CALLS.meaning}."
    )
    max_depth: int = Field(MAX_DEPTH.default, **MAX_DEPTH.pydantic_bounds(), description=f"{MAX_DEPTH.meaning}.")
    max_seconds: float = Field(
        MAX_SECONDS.default, **MAX_SECONDS.pydantic_bounds(), description=f"{MAX_SECONDS.meaning}."
    )
    max_cost: float | None = Field(MAX_COST.default, **MAX_COST.pydantic_bounds(), description=f"{MAX_COST.meaning}.")
    max_tokens: int | None = Field(
        MAX_TOKENS.default, **MAX_TOKENS.pydantic_bounds(), description=f"{MAX_TOKENS.meaning}."
    )
    concurrency: int = Field(16, ge=1, le=256, description="Concurrent sub-calls per batch.")
    child_concurrency: int = Field(4, ge=1, le=64, description="Concurrent child RLMs per batch.")
    context_roots: str | None = Field(
        None, description="Folders context paths must lie under (':'-separated); unset: any readable path."
    )
    session_idle_seconds: float = Field(1800.0, gt=0, description="Close idle sessions after this.")
    volume_quota_mb: int = Field(1024, ge=1, description="Disk use per local volume; a step past it is trimmed.")
    volume_max_files: int = Field(100_000, ge=1, description="Entries (files, folders, links) per local volume.")
    upload_max_mb: int = Field(200, ge=1, description="Largest upload (or request body) the web server accepts, MB.")
    retention_days: int | None = Field(
        None, ge=1, description="Delete finished runs (with their uploads) older than this; unset: keep them all."
    )
    # OpenTelemetry export (core/telemetry.py); the standard OTEL_EXPORTER_OTLP_* variables work too.
    otel: bool | None = Field(
        None,
        description="Export traces over OTLP/HTTP: true, false (even with OTEL_EXPORTER_OTLP_ENDPOINT set), "
        "unset: only when OTEL_EXPORTER_OTLP_ENDPOINT or otel_endpoint is set.",
    )
    otel_endpoint: str | None = Field(
        None, description="OTLP/HTTP collector base URL (spans go to <url>/v1/traces); unset: the OTEL_ variables'."
    )

    daytona_api_key: SecretStr | None = Field(
        None, validation_alias=AliasChoices("daytona_api_key", "DAYTONA_API_KEY", "FLEET_DAYTONA_API_KEY")
    )
    daytona_api_url: str | None = Field(
        None, validation_alias=AliasChoices("daytona_api_url", "DAYTONA_API_URL", "FLEET_DAYTONA_API_URL")
    )
    daytona_target: str | None = Field(
        None, validation_alias=AliasChoices("daytona_target", "DAYTONA_TARGET", "FLEET_DAYTONA_TARGET")
    )
    daytona_snapshot: str | None = Field(
        None, description="Daytona snapshot to run; unset: fleet-rlm's own, registered by `fleet-rlm daytona setup`."
    )
    daytona_network: Literal["block", "allow"] = Field(
        "block", description="Daytona sandbox network egress: block (default, like the local sandbox) or allow."
    )
    daytona_children: Literal["shared", "own"] = Field(
        "shared", description="Child RLMs on Daytona: a context in the parent's sandbox (shared) or their own sandbox."
    )
    daytona_max_sandboxes: int = Field(8, ge=1, le=256, description="Daytona sandboxes this process holds at once.")
    daytona_auto_stop_minutes: int = Field(
        15, ge=1, description="Idle minutes before Daytona stops a sandbox whose process went away."
    )
    daytona_cost_per_hour: float = Field(
        0.067, ge=0, description="USD per hour of one Daytona sandbox, recorded per run (default: 1 vCPU + 1 GiB)."
    )
    daytona_volume_prefix: str = Field("fleet-", description="Prefix of the Daytona volume behind each fleet volume.")
    mcp_token: SecretStr | None = Field(
        None, description="Bearer token of `fleet-mcp --transport http`; unset: a random one per launch."
    )

    # The workspace agent (``fleet_rlm.agent``): its model defaults to the root model.
    agent_lm_model: str | None = Field(None, description="The workspace agent's model (LiteLLM); unset: lm_model.")
    agent_lm_api_base: str | None = Field(None, description="Base URL for the agent's model; unset: lm_api_base.")
    agent_lm_api_key: SecretStr | None = Field(None, description="API key for the agent's model; unset: lm_api_key.")
    agent_volume: str = Field("workspace", description="The volume the agent reads and keeps memory in by default.")
    agent_approval_ttl_seconds: float = Field(
        86400.0, gt=0, description="Seconds a pending agent approval waits before it expires."
    )
    agent_run_cost_threshold: float = Field(
        1.0, ge=0, description="RLM runs the agent starts with a cost cap (USD) above this, or none, need approval."
    )
    agent_fetch_max_mb: int = Field(20, ge=1, description="Largest web page or repository the agent pulls in, MB.")
    agent_allowed_hosts: str | None = Field(
        None, description="The older name of fetch_allowed_hosts, still read: hosts either one names may be fetched."
    )

    # Web pages and repositories as context (runs and the agent share one fetch policy: core/inputs/fetch.py).
    fetch_allowed_hosts: str | None = Field(
        None,
        description="Hosts or networks (comma-separated) that runs and the agent may fetch from although private "
        "or loopback (127.0.0.1, 10.0.0.0/8, git.internal).",
    )
    fetch_max_mb: int = Field(20, ge=1, description="Largest web page or repository one run fetches as context, MB.")
    mcp_servers: dict[str, McpServerSpec] = Field(
        default_factory=dict,
        description='MCP servers a run may mount (--mcp NAME), as in .mcp.json: {"github": {"type": "http", '
        '"url": "...", "headers": {...}}, "files": {"command": "...", "args": [...]}}. docs/tools.md.',
    )
    tools: list[str] = Field(
        default_factory=list,
        description="Python functions (module:function) every run's REPL may call, run on the host. docs/tools.md.",
    )
    tool_timeout: float = Field(60.0, gt=0, description="Seconds one tool call from the REPL may take.")
    tool_result_max_chars: int = Field(
        1_000_000, ge=100, description="Largest tool result (as JSON characters) a REPL call may return."
    )

    # Every model key found, in the order the sources are read, with the endpoint it may go to.
    _model_keys: dict[str, tuple[BoundKey, ...]] = PrivateAttr(default_factory=dict)

    def __init__(self, **values: Any) -> None:
        super().__init__(**values)
        self._model_keys = _bound_model_keys(values)
        remember_secrets([k.value.get_secret_value() for keys in self._model_keys.values() for k in keys])

    def model_post_init(self, _context: Any) -> None:
        remember_secrets(self.secret_values())
        otlp_headers()  # registers the collector's credentials, whether or not this process exports

    @field_validator("models")
    @classmethod
    def _model_names(cls, value: dict[str, ModelSpec]) -> dict[str, ModelSpec]:
        bad = [name for name in value if not MODEL_NAME.fullmatch(name) or name in ("root", "sub", "agent")]
        if bad:
            names = ", ".join(map(repr, bad))
            raise ValueError(f"model name(s) {names}: a letter, then letters, digits, _ or -; not root, sub or agent")
        return value

    def bound_keys(self, field: str) -> tuple[BoundKey, ...]:
        """The values found for a model key (lm_api_key...), first source first, each with its endpoint."""
        return self._model_keys.get(field, ())

    def secret_values(self) -> list[str]:
        """Every secret these settings hold (keys, tokens), in clear: for masking, never for showing."""
        values = [*(getattr(self, name) for name in SECRET_FIELDS), *(m.api_key for m in self.models.values())]
        return [v.get_secret_value() for v in values if v is not None and v.get_secret_value()]

    def make_home(self) -> None:
        """Create FLEET_HOME and the runs' scratch root, both private to this user."""
        private_dir(self.home)
        private_dir(self.work_root)

    @property
    def allowed_context_roots(self) -> list[Path] | None:
        if not self.context_roots:
            return None
        roots = [Path(p).expanduser().resolve() for p in self.context_roots.split(os.pathsep) if p]
        return [*roots, self.uploads_root.resolve()]  # files uploaded through the web app are always allowed

    @property
    def store_path(self) -> Path:
        return self.home / "fleet.db"

    @property
    def volumes_root(self) -> Path:
        return self.home / "volumes"

    @property
    def work_root(self) -> Path:
        return self.home / "work"

    @property
    def uploads_root(self) -> Path:
        return self.home / "uploads"

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (
            init_settings,
            env_settings,
            KeyringSource(settings_cls),
            dotenv_settings,
            JsonConfigSettingsSource(settings_cls, json_file=user_settings_path()),
        )


class KeyringSource(PydanticBaseSettingsSource):
    """Secrets from the OS keyring; silently absent when no usable backend exists."""

    def get_field_value(self, field: FieldInfo, field_name: str) -> tuple[Any, str, bool]:
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        values: dict[str, Any] = {}
        for name in SECRET_FIELDS:
            value = keyring_get(name) if _keyring_wanted() else None
            if value:
                values[name] = value
        return values


# False while ``load_settings(secrets=False)`` builds settings: the keyring is not asked.
_SECRETS_WANTED: ContextVar[bool] = ContextVar("fleet_secrets_wanted", default=True)


def _keyring_wanted() -> bool:
    return _SECRETS_WANTED.get() and not os.environ.get("FLEET_NO_KEYRING")


def secret_setting(name: str) -> str | None:
    """One secret without loading all settings: its environment variable, else the keyring.

    Blank (or whitespace) counts as unset. Registered for masking like any loaded secret."""
    value = (os.environ.get(env_name(name)) or "").strip()
    if not value and _keyring_wanted():
        value = (keyring_get(name) or "").strip()
    remember_secrets([value])
    return value or None


def keyring_status() -> tuple[bool, str]:
    """(usable, backend description). Plaintext and fail/null backends are not usable."""
    try:
        import keyring
    except ImportError:  # pragma: no cover - keyring is a dependency
        return False, "the keyring package is not installed"
    backend = keyring.get_keyring()
    name = f"{type(backend).__module__}.{type(backend).__name__}"
    if any(part in name for part in ("keyring.backends.fail", "keyring.backends.null", "keyrings.alt")):
        return False, name
    return True, name


NO_KEYRING_HELP = (
    "no secure OS keyring is available ({backend}). Set the key in the environment instead "
    "(export {env}=...), or install and unlock a Secret Service (e.g. gnome-keyring) so "
    "fleet-rlm can store it."
)


def keyring_get(name: str) -> str | None:
    usable, _ = keyring_status()
    if not usable:
        return None
    import keyring
    from keyring.errors import KeyringError

    try:
        return keyring.get_password(KEYRING_SERVICE, name)
    except KeyringError:
        return None


def keyring_set(name: str, value: str) -> None:
    usable, backend = keyring_status()
    if not usable:
        raise ConfigError(NO_KEYRING_HELP.format(backend=backend, env=env_name(name)))
    import keyring
    from keyring.errors import KeyringError

    try:
        keyring.set_password(KEYRING_SERVICE, name, value)
    except KeyringError as exc:
        raise _keyring_refused(exc, name) from None


def keyring_delete(name: str) -> bool:
    usable, _ = keyring_status()
    if not usable:
        return False
    import keyring
    from keyring.errors import KeyringError, PasswordDeleteError

    try:
        keyring.delete_password(KEYRING_SERVICE, name)
    except PasswordDeleteError:
        return False
    except KeyringError as exc:
        raise _keyring_refused(exc, name) from None
    return True


def _keyring_refused(exc: Exception, name: str) -> ConfigError:
    """A keyring that is there but says no (locked, and no prompt can be shown from here)."""
    field = name.partition(".")[0]  # the key's endpoint is saved under the key's name + ".endpoint"
    return ConfigError(
        f"the OS keyring refused to change {field} ({type(exc).__name__}: {exc}): unlock it (log in to the "
        f"desktop session, or run `gnome-keyring-daemon --unlock`), or set the key in the environment "
        f"instead (export {env_name(field)}=...)"
    )


# -- which key each model sends -------------------------------------------------------------------
#
# A key goes only to the endpoint it was given for. A key in the keyring is saved together with the
# endpoint its model used when it was saved (only ``save_settings`` writes either, and only when the
# key itself is in the change). A key in the environment or .env, which no face can write, is for the
# endpoint the environment and .env name; a key saved by an older version, with no endpoint beside
# it, is treated the same. settings.json, which every face writes, can move a model but never a key.


def _binding_name(field: str) -> str:
    return f"{field}.endpoint"


def forget_secret(name: str) -> bool:
    """Remove a secret from the keyring, with the endpoint saved for it; True if it was there."""
    keyring_delete(_binding_name(name))
    return keyring_delete(name)


def _bound(value: Any, endpoint: Endpoint | None, origin: str) -> BoundKey | None:
    text = value.get_secret_value() if isinstance(value, SecretStr) else value
    return BoundKey(SecretStr(text), endpoint, origin) if isinstance(text, str) and text.strip() else None


def _pinned_sources() -> tuple[dict[str, Any], dict[str, Any]]:
    """What the environment and .env set, read as the settings read them: the sources no face writes."""
    return EnvSettingsSource(Settings)(), DotEnvSettingsSource(Settings)()


def _bound_model_keys(init: Mapping[str, Any]) -> dict[str, tuple[BoundKey, ...]]:
    """Every value of each model key, in the settings' source order, each bound to its endpoint."""
    env, dotenv = _pinned_sources()
    pinned = {**dotenv, **env, **init}  # the caller's own values count as pinned too
    keys: dict[str, tuple[BoundKey, ...]] = {}
    for role, (_, _, field) in ROLE_FIELDS.items():
        named = endpoint_of(pinned, role)
        found = (
            _bound(init.get(field), named, "the caller's settings"),
            _bound(env.get(field), named, f"the environment ({env_name(field)})"),
            _keyring_key(field, named),
            _bound(dotenv.get(field), named, ".env"),
        )
        keys[field] = tuple(key for key in found if key is not None)
    for name in {*_specs(init), *_specs(env), *_specs(dotenv)}:  # named models: each key with its own spec
        found = (
            _named_key(_specs(init).get(name), "the caller's settings"),
            _named_key(_specs(env).get(name), "the environment (FLEET_MODELS)"),
            _named_key(_specs(dotenv).get(name), ".env (FLEET_MODELS)"),
        )
        keys[named_key_field(name)] = tuple(key for key in found if key is not None)
    return keys


def named_key_field(name: str) -> str:
    return f"models.{name}.api_key"


def _specs(values: Mapping[str, Any]) -> dict[str, Any]:
    """The named models one source gives, as plain mappings (a source may give JSON text or specs)."""
    raw = values.get("models")
    if isinstance(raw, str):
        try:
            raw = json.loads(raw)
        except ValueError:
            return {}
    if not isinstance(raw, Mapping):
        return {}
    specs = {str(k): v for k, v in raw.items() if isinstance(v, (Mapping, ModelSpec))}
    return {k: v.model_dump() if isinstance(v, ModelSpec) else v for k, v in specs.items()}


def _named_key(spec: Mapping[str, Any] | None, origin: str) -> BoundKey | None:
    """A named model's key, bound to the endpoint the same source's spec names beside it: another source
    (settings.json, which every face writes) may move the model, never its key."""
    if spec is None:
        return None
    return _bound(spec.get("api_key"), named_endpoint(spec), origin)


def _keyring_key(field: str, named: Endpoint | None) -> BoundKey | None:
    if not _keyring_wanted():
        return None
    value = keyring_get(field)
    if not value:
        return None
    saved = keyring_get(_binding_name(field))
    if saved is None:  # saved by an older version: only where the environment and .env point
        return _bound(value, named, "the keyring (saved by an older version)")
    return _bound(value, Endpoint.from_json(saved), "the keyring")


@dataclass(frozen=True)
class KeyChoice:
    """The key a model sends (None: none) and, when a configured key stays behind, why (no secret)."""

    value: str | None
    note: str | None = None


def key_for(settings: Settings, role: Role) -> KeyChoice:
    """The key ``role``'s requests carry: one bound to the endpoint they go to, else none.

    The role's own key comes first; the sub model and the agent use the root's key only when they
    use the root's endpoint."""
    values = dict(settings)
    target = endpoint_of(values, role)
    if target is None:  # no model: build_lm says so
        return KeyChoice(None)
    field = ROLE_FIELDS[role][2]
    own = settings.bound_keys(field)
    shared = role != "root" and target == endpoint_of(values, "root")
    root = settings.bound_keys("lm_api_key") if role != "root" else ()
    for key in (*own, *(root if shared else ())):
        if key.endpoint == target:
            return KeyChoice(key.value.get_secret_value())
    if own:
        return KeyChoice(None, _withheld(field, own[0], target))
    if shared and root:
        return KeyChoice(None, _withheld("lm_api_key", root[0], target))
    if root:
        return KeyChoice(None, f"no API key is sent to {target}: lm_api_key is only for the root model's "
                               f"endpoint; give this model its own with `fleet-rlm config set {field}` "
                               "or the Settings page")  # fmt: skip
    return KeyChoice(None)


def key_for_model(settings: Settings, name: str) -> KeyChoice:
    """The key named model ``name`` sends: its own, bound to the endpoint it goes to, else the root's when
    it goes to the root's endpoint, else none (with why, when a configured key stays behind)."""
    target = named_endpoint(settings.models[name])
    if target is None:
        return KeyChoice(None)
    own = settings.bound_keys(named_key_field(name))
    shared = target == endpoint_of(dict(settings), "root")
    root = settings.bound_keys("lm_api_key")
    for key in (*own, *(root if shared else ())):
        if key.endpoint == target:
            return KeyChoice(key.value.get_secret_value())
    if own:
        given = own[0].endpoint or "no endpoint"
        note = f"the api_key of model {name!r} from {own[0].origin} is for {given}"
        return KeyChoice(None, f"the API key was withheld from {target}: {note}; give it with its api_base")
    if shared and root:
        return KeyChoice(None, _withheld("lm_api_key", root[0], target))
    return KeyChoice(None)


def models_shown(settings: Settings, *, keys: bool = True) -> dict[str, dict[str, Any]]:
    """The named models as faces show them: a key only as whether it is set, or (``keys=False``, for a
    form that saves what it shows back to settings.json, which never holds a key) not at all."""
    shown = {name: {"model": spec.model, "api_base": spec.api_base} for name, spec in settings.models.items()}
    if keys:
        for name, spec in settings.models.items():
            shown[name]["api_key"] = "set" if spec.api_key else None
    return shown


def withheld_keys(settings: Settings) -> dict[str, str]:
    """Each model key that is set but not sent, because it is for another endpoint than its model's: why."""
    values = dict(settings)
    withheld = {}
    for role, (_, _, field) in ROLE_FIELDS.items():
        own, target = settings.bound_keys(field), endpoint_of(values, role)
        if own and target is not None and all(key.endpoint != target for key in own):
            withheld[field] = _withheld(field, own[0], target)
    return withheld


def _withheld(field: str, key: BoundKey, target: Endpoint) -> str:
    given = key.endpoint or "no endpoint (the environment and .env name no model or base for it)"
    return (f"the API key was withheld from {target}: {field} from {key.origin} is for {given}; give it "
            f"again for this endpoint with `fleet-rlm config set {field}` or the Settings page")  # fmt: skip


class ConfigError(UserError):
    """A setting is missing or wrong; the message says how to fix it."""


class NoModelConfigured(ConfigError):
    """No model is set: a face whose settings come from elsewhere (an MCP client's config) says where."""


def sandbox_setting_fix() -> str:
    """How to undo an unusable sandbox setting, said where the setting comes from (so the fix works)."""
    if os.environ.get("FLEET_SANDBOX"):
        return "set FLEET_SANDBOX=local (or unset it)"
    if "sandbox" in read_user_settings():
        return f"run `fleet-rlm config unset sandbox` (it is set in {user_settings_path()})"
    return "set FLEET_SANDBOX=local (check .env in this folder)"


# -- the OpenTelemetry collector's headers ------------------------------------------------------

OTLP_HEADER_VARIABLES = ("OTEL_EXPORTER_OTLP_HEADERS", "OTEL_EXPORTER_OTLP_TRACES_HEADERS")
_AUTH_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9!#$%&'*+.^_`|~-]*)\s+(\S.*)")  # RFC 9110: scheme SP credentials


def otlp_headers() -> dict[str, str]:
    """The OTLP headers of the environment (``key=value,...``, values URL-encoded, the per-signal
    variable's after the general one's), each value registered for masking with what it carries: the
    credential after an auth scheme (``Bearer <token>``) and a Basic credential's ``user:password``
    and password, so none of them is shown alone either."""
    from urllib.parse import unquote

    raw = ",".join(filter(None, ((os.environ.get(name) or "").strip() for name in OTLP_HEADER_VARIABLES)))
    pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
    headers = {key.strip(): unquote(value.strip()) for key, value in pairs}
    masked = [raw]
    for value in headers.values():
        masked.append(value)
        scheme = _AUTH_SCHEME.fullmatch(value)
        if scheme is None:
            continue
        credential = scheme.group(2).strip()
        masked.append(credential)
        if scheme.group(1).lower() == "basic":
            with contextlib.suppress(ValueError):
                pair = base64.b64decode(credential, validate=True).decode()
                masked += [pair, pair.partition(":")[2]]
    remember_secrets(masked)
    return headers


def env_name(field: str) -> str:
    if field in ("daytona_api_key", "daytona_api_url", "daytona_target"):  # the Daytona SDK's own variables
        return field.upper()
    return f"FLEET_{field.upper()}"


def load_settings(*, secrets: bool = True, **overrides: Any) -> Settings:
    """Settings from every source. ``secrets=False`` leaves the OS keyring unasked (importing keyring
    and a Secret Service round trip per secret cost a read command most of its start-up); secrets in
    the environment still load."""
    wanted = _SECRETS_WANTED.set(secrets)
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:  # pydantic ValidationError is a ValueError
        raise ConfigError(_explain_validation(exc)) from None
    finally:
        _SECRETS_WANTED.reset(wanted)


def _explain_validation(exc: ValueError) -> str:
    errors = getattr(exc, "errors", None)
    if not callable(errors):
        return str(exc)
    lines = []
    for err in errors():
        field = ".".join(str(p) for p in err.get("loc", ()))
        lines.append(f"{env_name(field)}: {err.get('msg')}")
    return "invalid settings: " + "; ".join(lines)


def mask(value: str | None) -> str:
    """Show that a secret is set without showing it."""
    if not value:
        return "(not set)"
    return "set (…" + value[-4:] + ")" if len(value) >= 12 else "set"


def read_user_settings() -> dict[str, Any]:
    path = user_settings_path()
    if not path.exists():
        return {}
    return json.loads(path.read_text() or "{}")


def write_user_settings(values: dict[str, Any]) -> None:
    leaked = [k for k in values if k in SECRET_FIELDS]
    if leaked:  # defence in depth: secrets never go to a file
        raise ConfigError(f"refusing to write secrets to a file: {', '.join(leaked)}")
    path = user_settings_path()
    private_dir(path.parent)
    # A fresh file per write (mkstemp: O_EXCL, mode 0600), so two processes saving at once never
    # rename each other's half-written file; the last replace wins whole.
    fd, tmp = tempfile.mkstemp(prefix=".settings-", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as out:
            out.write(json.dumps(values, indent=2, sort_keys=True) + "\n")
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


@contextlib.contextmanager
def _settings_lock() -> Iterator[None]:
    """Hold the lock on ``settings.json``: one read-modify-write at a time, across processes."""
    path = user_settings_path()
    private_dir(path.parent)
    fd = os.open(path.parent / ".settings.lock", os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)  # released when the descriptor closes, even if we crash
        yield
    finally:
        os.close(fd)


def update_user_settings(change: Callable[[dict[str, Any]], None]) -> None:
    """Read ``settings.json``, apply ``change`` to it in place and write it back, under the lock, so
    two saves of different keys at once (``config set`` and ``config unset``, the web app) both land."""
    with _settings_lock():
        values = read_user_settings()
        change(values)
        write_user_settings(values)


# -- listing and saving settings (shared by `fleet-rlm config` and the web app) -----------------

SETTING_SOURCES = ("env", "keyring", "dotenv", "file", "default")
# What a running server must not change (the web app refuses it), with how to change it instead.
RESTART_ONLY = {
    "home": "it is where the store lives; set FLEET_HOME and restart",
    "context_roots": "it guards which host files runs may read; set FLEET_CONTEXT_ROOTS or run "
    "`fleet-rlm config set context_roots FOLDERS`, then restart",
    # The Daytona key goes wherever this points: a face that can save settings must not move it.
    "daytona_api_url": "the Daytona API key is sent there; set DAYTONA_API_URL or run "
    "`fleet-rlm config set daytona_api_url URL`, then restart",
    "agent_allowed_hosts": "it opens private and loopback hosts to the agent's fetches; set "
    "FLEET_AGENT_ALLOWED_HOSTS or run `fleet-rlm config set agent_allowed_hosts HOSTS`, then restart",
    "fetch_allowed_hosts": "it opens private and loopback hosts to runs' and the agent's fetches; set "
    "FLEET_FETCH_ALLOWED_HOSTS or run `fleet-rlm config set fetch_allowed_hosts HOSTS`, then restart",
    # Runs' traces (questions, code, outputs, answers) go where these say: a face must not move or stop them.
    "otel": "it turns the export of runs' traces on or off; set FLEET_OTEL or run "
    "`fleet-rlm config set otel true|false`, then restart",
    "otel_endpoint": "runs' traces (questions, code, outputs, answers) are sent there; set FLEET_OTEL_ENDPOINT "
    "(or OTEL_EXPORTER_OTLP_ENDPOINT) or run `fleet-rlm config set otel_endpoint URL`, then restart",
}


def setting_origins() -> dict[str, list[str]]:
    """Every source (of ``SETTING_SOURCES``) that gives each setting a value, in the order ``Settings``
    reads them, so the first is the one in effect and none means the default. Asked of the very sources
    ``Settings.settings_customise_sources`` builds, not worked out again."""
    from pydantic import AliasChoices
    from pydantic_settings import DotEnvSettingsSource, EnvSettingsSource, InitSettingsSource, SecretsSettingsSource

    keys = {}  # the names a source may give a setting under: the field, its FLEET_ variable, its aliases
    for name, info in Settings.model_fields.items():
        aliases = info.validation_alias.choices if isinstance(info.validation_alias, AliasChoices) else []
        keys[name] = {name, f"fleet_{name}", *(str(a).lower() for a in aliases)}
    sources = Settings.settings_customise_sources(
        Settings, InitSettingsSource(Settings, {}), EnvSettingsSource(Settings), DotEnvSettingsSource(Settings),
        SecretsSettingsSource(Settings),
    )  # fmt: skip
    origins: dict[str, list[str]] = {name: [] for name in Settings.model_fields}
    for label, source in zip(("init", *SETTING_SOURCES[:-1]), sources, strict=True):
        given = {key.lower() for key in source()}
        for name, names in keys.items():
            if given & names:
                origins[name].append(label)
    return origins


def setting_file(name: str) -> str | None:
    """The file that gives setting ``name`` its value, when the environment does not: ``.env`` (read
    first) or settings.json (its path); None: neither. Asks no keyring, unlike ``setting_origins``."""
    if name in DotEnvSettingsSource(Settings)():
        return ".env"
    return str(user_settings_path()) if name in read_user_settings() else None


def source_in_effect(origins: list[str]) -> str:
    """The source a setting's value comes from, given its ``setting_origins``: the first, else the default."""
    return origins[0] if origins else "default"


def describe_settings() -> list[dict[str, Any]]:
    """Every setting: its value (never a secret's), where it comes from, and whether the environment
    hides a saved value (a saved change then has no effect until the variable is unset)."""
    settings = load_settings()
    origins = setting_origins()
    withheld = withheld_keys(settings)
    rows = []
    for name, info in Settings.model_fields.items():
        secret = name in SECRET_FIELDS
        value = getattr(settings, name)
        source = source_in_effect(origins[name])
        hidden = source == "env" and len(origins[name]) > 1
        rows.append({
            "name": name,
            "env": env_name(name),
            "value": models_shown(settings, keys=False) if name == "models" else None if secret or value is None
            else (str(value) if isinstance(value, Path) else value),
            "source": source,
            "secret": secret,
            "set": value is not None,
            "overridden_by_env": hidden,
            "withheld": withheld.get(name),
            "restart_only": RESTART_ONLY.get(name),
            "description": info.description or "",
        })  # fmt: skip
    return rows


def validate_setting(name: str, value: Any, values: dict[str, Any]) -> None:
    """Reject a bad value before it is saved, in one line naming the setting."""
    from pydantic import ValidationError

    try:
        Settings.model_validate({**values, name: value, "home": default_home()})
    except ValidationError as exc:
        reasons = "; ".join(str(err.get("msg")) for err in exc.errors())
        raise UserError(f"{name} = {value!r} is not valid: {reasons}") from None


def save_settings(changes: dict[str, Any], *, running: bool = False) -> None:
    """Save several settings at once: secrets to the OS keyring, the rest to ``settings.json``.

    A null or empty value removes the saved one. Everything is checked before anything is written,
    and secrets are refused (with the fix) when no secure keyring is available. A model key is saved
    with the endpoint its model uses once the change applies (``key_for``). ``running``: the change
    comes through a running server, which refuses ``RESTART_ONLY`` settings."""
    unknown = sorted(set(changes) - set(Settings.model_fields))
    if unknown:
        raise UserError(f"unknown setting(s) {', '.join(unknown)}: GET /api/settings or `fleet-rlm config list`")
    fixed = [f"{name} cannot be changed while running: {RESTART_ONLY[name]}" for name in changes
             if running and name in RESTART_ONLY]  # fmt: skip
    if fixed:
        raise UserError("; ".join(fixed))
    secrets = {k: v for k, v in changes.items() if k in SECRET_FIELDS}
    for name, value in secrets.items():
        if value not in (None, "") and not isinstance(value, str):
            raise UserError(f"{name} must be a string")
    if any(secrets.values()):
        usable, backend = keyring_status()
        if not usable or not _keyring_wanted():
            first = next(k for k, v in secrets.items() if v)
            raise ConfigError(NO_KEYRING_HELP.format(backend=backend, env=env_name(first)))

    if "models" in changes:
        changes = {**changes, "models": _models_to_save(changes["models"])}

    def apply(saved: dict[str, Any]) -> None:
        for name, value in changes.items():
            if name in SECRET_FIELDS:
                continue
            if value in (None, ""):
                saved.pop(name, None)
            else:
                validate_setting(name, value, {k: v for k, v in saved.items() if k != name})
                saved[name] = value
        endpoints = _endpoints_for_keys([k for k, v in secrets.items() if v], saved)
        for name, value in secrets.items():  # only once every value has passed
            if not value:
                forget_secret(name)
                continue
            # The old endpoint goes first: a save cut short leaves the new key bound to none (the
            # environment's, as an older version's key is), never to the previous key's endpoint.
            keyring_delete(_binding_name(name))
            keyring_set(name, value)
            if name in endpoints:
                keyring_set(_binding_name(name), endpoints[name].to_json())

    update_user_settings(apply)


def _models_to_save(value: Any) -> Any:
    """Named models as settings.json keeps them: JSON text read, and refused when it carries a key."""
    if isinstance(value, str) and value.strip():
        try:
            value = json.loads(value)
        except ValueError as exc:
            example = '{"fast": {"model": "openai/gpt-4o-mini"}}'
            raise UserError(f"models must be JSON, as in {example}: {exc}") from None
    if isinstance(value, Mapping) and any(isinstance(s, Mapping) and s.get("api_key") for s in value.values()):
        raise UserError("models: an api_key is never saved to a file; give the model with its key in FLEET_MODELS "
                        "(the environment or .env), or save it here without one")  # fmt: skip
    return value


def _endpoints_for_keys(fields: list[str], saved: dict[str, Any]) -> dict[str, Endpoint]:
    """The endpoint each model key in ``fields`` is for once ``saved`` is settings.json (the
    environment and .env still win); refused, with the fix, for a model key with no model yet."""
    env, dotenv = _pinned_sources()
    values = {**saved, **dotenv, **env}
    roles = {field: role for role, (_, _, field) in ROLE_FIELDS.items()}
    endpoints = {}
    for field in (f for f in fields if f in roles):
        endpoint = endpoint_of(values, roles[field])
        if endpoint is None:
            raise UserError(f"{field} is kept for its model's endpoint and no model is set: save lm_model "
                            "(and lm_api_base for a server of your own) first, or together with the key")  # fmt: skip
        endpoints[field] = endpoint
    return endpoints
