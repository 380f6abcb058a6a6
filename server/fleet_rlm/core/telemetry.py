"""Whether and where runs are exported as OpenTelemetry traces; the exporter itself is ``core.otel_export``.

Off by default. On when ``FLEET_OTEL=true``, ``FLEET_OTEL_ENDPOINT`` or the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (``FLEET_OTEL=false`` and
``OTEL_SDK_DISABLED=true`` turn it off). Standard library only: the OpenTelemetry SDK is imported by
``start_telemetry``, and only when the export is on, so start-up stays fast.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import unquote, urlsplit, urlunsplit

from fleet_rlm.redaction import remember_secrets

if TYPE_CHECKING:
    from fleet_rlm.config import Settings
    from fleet_rlm.store import Store

DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"  # the OTLP/HTTP default every collector listens on
_SUPPORTED_PROTOCOL = "http/protobuf"


class Telemetry(Protocol):
    def close(self) -> None: ...


@dataclass(frozen=True)
class OtelTarget:
    endpoint: str  # the full traces URL
    header_names: tuple[str, ...]  # names only: their values are credentials
    protocol: str


def _env(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


def _traces_url(base: str) -> str:
    return base.rstrip("/") + "/v1/traces"


def otel_target(settings: Settings) -> OtelTarget | None:
    """Where spans go, or None when the export is off."""
    if settings.otel is False or (_env("OTEL_SDK_DISABLED") or "").lower() == "true":
        return None
    if settings.otel_endpoint:
        endpoint = _traces_url(settings.otel_endpoint)
    elif traces := _env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        endpoint = traces  # the per-signal variable is the full URL (the OTLP specification)
    elif base := _env("OTEL_EXPORTER_OTLP_ENDPOINT"):
        endpoint = _traces_url(base)
    elif settings.otel:
        endpoint = DEFAULT_ENDPOINT
    else:
        return None
    headers = _headers()
    protocol = _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _env("OTEL_EXPORTER_OTLP_PROTOCOL") or _SUPPORTED_PROTOCOL
    return OtelTarget(endpoint=endpoint, header_names=tuple(headers), protocol=protocol)


def _headers() -> dict[str, str]:
    """The OTLP headers (``key=value,...``), their values remembered as secrets so no log or event shows them."""
    raw = ",".join(filter(None, (_env("OTEL_EXPORTER_OTLP_HEADERS"), _env("OTEL_EXPORTER_OTLP_TRACES_HEADERS"))))
    pairs = (item.split("=", 1) for item in raw.split(",") if "=" in item)
    headers = {key.strip(): unquote(value.strip()) for key, value in pairs}  # values are URL-encoded (the spec)
    remember_secrets([*headers.values(), raw])
    return headers


def shown_endpoint(url: str) -> str:
    """The endpoint without a user name or password in it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def telemetry_check(settings: Settings) -> dict[str, Any]:
    """The doctor's line: off, or where spans go (header names only)."""
    target = otel_target(settings)
    if target is None:
        return {"ok": True, "detail": "OpenTelemetry export off (set OTEL_EXPORTER_OTLP_ENDPOINT or FLEET_OTEL=true)"}
    headers = f", headers: {', '.join(target.header_names)}" if target.header_names else ""
    detail = f"OpenTelemetry spans to {shown_endpoint(target.endpoint)} (OTLP/HTTP{headers})"
    if target.protocol != _SUPPORTED_PROTOCOL:
        return {
            "ok": False,
            "detail": f"{detail}: protocol {target.protocol} is not supported, spans go as {_SUPPORTED_PROTOCOL}",
            "fix": "set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
        }
    return {"ok": True, "detail": detail}


def start_telemetry(settings: Settings, store: Store) -> Telemetry | None:
    """Export this process's runs from the store's committed (already redacted) events; None when off."""
    target = otel_target(settings)
    if target is None:
        return None
    from fleet_rlm.core.otel_export import SpanExport

    export = SpanExport(target.endpoint, _headers())
    store.add_listener(export.offer)
    return export
