"""Settings: environment (``FLEET_*``), then the OS keyring for secrets, then ``.env``, then
the user's ``settings.json`` under ``FLEET_HOME``.

Secrets are ``SecretStr`` and live only in the environment or the keyring: ``fleet-rlm config
set`` refuses to write them to a file, and every value loaded is registered with
``fleet_rlm.redaction`` so it is masked wherever it would appear. ``FLEET_HOME`` and the files
fleet-rlm writes there are private to the user (0700 folders, 0600 files). Keep this module
light: ``--help`` imports it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import stat
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Literal

from pydantic import AliasChoices, Field, SecretStr
from pydantic.fields import FieldInfo
from pydantic_settings import (
    BaseSettings,
    JsonConfigSettingsSource,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)

from fleet_rlm.core.errors import UserError
from fleet_rlm.redaction import remember_secrets

KEYRING_SERVICE = "fleet-rlm"
SECRET_FIELDS = ("lm_api_key", "sub_lm_api_key", "daytona_api_key", "mcp_token", "agent_lm_api_key")


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

    sandbox: str = Field("local", description="Where code runs: a sandbox backend (local or daytona).")
    isolation: Literal["auto", "bwrap", "none"] = Field("auto", description="Local sandbox isolation.")
    exec_timeout: float = Field(300.0, gt=0, description="Seconds one code step may run.")
    memory_mb: int = Field(2048, ge=64, description="Memory cap of the whole sandbox (all its processes), MB.")
    max_procs: int = Field(64, ge=1, description="Processes and threads sandboxed code may run at once.")
    output_chars: int = Field(10_000, ge=200, description="Output of one step the model sees (head+tail).")

    max_iters: int = Field(20, ge=1, description="Steps per RLM node.")
    max_llm_calls: int = Field(500, ge=1, description="Model calls per run, all nodes together.")
    max_depth: int = Field(2, ge=0, description="Child RLM nesting depth (0: rlm_query is a plain call).")
    max_seconds: float = Field(1800.0, gt=0, description="Wall time per run.")
    max_cost: float | None = Field(None, gt=0, description="USD per run, where LiteLLM knows prices.")
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
        None, description="Hosts or networks (comma-separated) the agent may fetch from although private or loopback."
    )

    def model_post_init(self, _context: Any) -> None:
        remember_secrets(self.secret_values())

    def secret_values(self) -> list[str]:
        """Every secret these settings hold (keys, tokens), in clear: for masking, never for showing."""
        values = (getattr(self, name) for name in SECRET_FIELDS)
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


def _keyring_wanted() -> bool:
    return not os.environ.get("FLEET_NO_KEYRING")


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

    keyring.set_password(KEYRING_SERVICE, name, value)


def keyring_delete(name: str) -> bool:
    usable, _ = keyring_status()
    if not usable:
        return False
    import keyring
    from keyring.errors import PasswordDeleteError

    try:
        keyring.delete_password(KEYRING_SERVICE, name)
    except PasswordDeleteError:
        return False
    return True


class ConfigError(UserError):
    """A setting is missing or wrong; the message says how to fix it."""


def env_name(field: str) -> str:
    if field in ("daytona_api_key", "daytona_api_url", "daytona_target"):  # the Daytona SDK's own variables
        return field.upper()
    return f"FLEET_{field.upper()}"


def load_settings(**overrides: Any) -> Settings:
    try:
        return Settings(**{k: v for k, v in overrides.items() if v is not None})
    except ValueError as exc:  # pydantic ValidationError is a ValueError
        raise ConfigError(_explain_validation(exc)) from None


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
RESTART_ONLY = frozenset({"home"})  # where the store lives: a running server cannot move it


def dotenv_settings() -> dict[str, str | None]:
    """The working directory's ``.env``, keys lower-cased (settings names are case-insensitive)."""
    if not os.path.isfile(".env"):
        return {}
    from dotenv import dotenv_values

    return {k.lower(): v for k, v in dotenv_values(".env").items()}


def setting_source(name: str, dotenv: dict[str, str | None], saved: dict[str, Any]) -> str:
    """Where the value in effect comes from (one of ``SETTING_SOURCES``), in the order settings are read."""
    env = env_name(name)
    if os.environ.get(env):
        return "env"
    if name in SECRET_FIELDS and _keyring_wanted() and keyring_get(name):
        return "keyring"
    if dotenv.get(env.lower()):
        return "dotenv"
    return "file" if name in saved and name not in SECRET_FIELDS else "default"


def describe_settings() -> list[dict[str, Any]]:
    """Every setting: its value (never a secret's), where it comes from, and whether the environment
    hides a saved value (a saved change then has no effect until the variable is unset)."""
    settings = load_settings()
    dotenv, saved = dotenv_settings(), read_user_settings()
    rows = []
    for name, info in Settings.model_fields.items():
        secret = name in SECRET_FIELDS
        value = getattr(settings, name)
        source = setting_source(name, dotenv, saved)
        hidden = name in saved or bool(dotenv.get(env_name(name).lower()))
        if secret and source == "env":
            hidden = hidden or (_keyring_wanted() and keyring_get(name) is not None)
        rows.append({
            "name": name,
            "env": env_name(name),
            "value": None if secret or value is None else (str(value) if isinstance(value, Path) else value),
            "source": source,
            "secret": secret,
            "set": value is not None,
            "overridden_by_env": source == "env" and hidden,
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


def save_settings(changes: dict[str, Any]) -> None:
    """Save several settings at once: secrets to the OS keyring, the rest to ``settings.json``.

    A null or empty value removes the saved one. Everything is checked before anything is written,
    and secrets are refused (with the fix) when no secure keyring is available."""
    unknown = sorted(set(changes) - set(Settings.model_fields))
    if unknown:
        raise UserError(f"unknown setting(s) {', '.join(unknown)}: GET /api/settings or `fleet-rlm config list`")
    fixed = sorted(set(changes) & RESTART_ONLY)
    if fixed:
        raise UserError(f"{', '.join(fixed)} cannot be changed while running: set FLEET_HOME and restart")
    secrets = {k: v for k, v in changes.items() if k in SECRET_FIELDS}
    for name, value in secrets.items():
        if value not in (None, "") and not isinstance(value, str):
            raise UserError(f"{name} must be a string")
    if any(secrets.values()):
        usable, backend = keyring_status()
        if not usable or not _keyring_wanted():
            first = next(k for k, v in secrets.items() if v)
            raise ConfigError(NO_KEYRING_HELP.format(backend=backend, env=env_name(first)))

    def apply(saved: dict[str, Any]) -> None:
        for name, value in changes.items():
            if name in SECRET_FIELDS:
                continue
            if value in (None, ""):
                saved.pop(name, None)
            else:
                validate_setting(name, value, {k: v for k, v in saved.items() if k != name})
                saved[name] = value
        for name, value in secrets.items():  # only once every value has passed
            if value:
                keyring_set(name, value)
            else:
                keyring_delete(name)

    update_user_settings(apply)
