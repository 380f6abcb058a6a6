"""Whether and where runs are exported as OpenTelemetry traces; the exporter itself is ``core.otel_export``.

Off by default. On when ``FLEET_OTEL=true``, ``FLEET_OTEL_ENDPOINT`` or the standard
``OTEL_EXPORTER_OTLP_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` is set (``FLEET_OTEL=false`` and
``OTEL_SDK_DISABLED=true`` turn it off). Standard library only: the OpenTelemetry SDK is imported by
``start_telemetry``, and only when the export is on, so start-up stays fast.

The OTLP headers (``OTEL_EXPORTER_OTLP_HEADERS``: a collector's key) go only to the endpoint the
environment names, as a model key goes only to its endpoint (``config.key_for``): an ``otel_endpoint``
from a file (settings.json, which ``fleet-rlm config set`` writes, or ``.env``) that points elsewhere
gets the spans without them, and ``telemetry_check`` (the doctor's line) says so. A running server
cannot change ``otel`` or ``otel_endpoint`` at all (``config.RESTART_ONLY``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol
from urllib.parse import urlsplit, urlunsplit

from fleet_rlm.config import normalise_base, otlp_headers, setting_file

if TYPE_CHECKING:
    from fleet_rlm.config import Settings
    from fleet_rlm.store import Store

log = logging.getLogger(__name__)

DEFAULT_ENDPOINT = "http://localhost:4318/v1/traces"  # the OTLP/HTTP default every collector listens on
_SUPPORTED_PROTOCOL = "http/protobuf"
# The variables that name an endpoint, in the order they count; FLEET_OTEL_ENDPOINT is a base URL, as
# OTEL_EXPORTER_OTLP_ENDPOINT is, and the per-signal variable the full URL (the OTLP specification).
_ENDPOINT_VARIABLES = ("FLEET_OTEL_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")


class Telemetry(Protocol):
    def close(self) -> None: ...


@dataclass(frozen=True)
class OtelTarget:
    endpoint: str  # the full traces URL
    header_names: tuple[str, ...]  # of the headers sent there; names only: their values are credentials
    protocol: str
    withheld: tuple[str, ...] = ()  # headers of the environment not sent: they are for ``bound_to``
    bound_to: str = DEFAULT_ENDPOINT  # where the environment's headers may go
    hidden: tuple[str, str] | None = None  # (variable, URL) of the environment's endpoint a file setting hides
    origin: str = "the environment"  # where the endpoint in effect was set


def _env(name: str) -> str | None:
    return os.environ.get(name, "").strip() or None


def _traces_url(base: str) -> str:
    return base.rstrip("/") + "/v1/traces"


def _environment_endpoint() -> tuple[str, str] | None:
    """(variable, traces URL) of the endpoint the process environment names, None when it names none."""
    for name in _ENDPOINT_VARIABLES:
        if value := _env(name):
            return name, value if name == "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT" else _traces_url(value)
    return None


def _same(a: str, b: str) -> bool:
    return normalise_base(a) == normalise_base(b)


def _file_origin(name: str) -> str:
    """Which file gives setting ``name`` its value, when the environment does not."""
    return setting_file(name) or "the caller's settings"


def otel_target(settings: Settings) -> OtelTarget | None:
    """Where spans go, or None when the export is off; the headers of the environment only when they
    go to the endpoint the environment names (or, when it names none, to the OTLP default)."""
    headers = otlp_headers()  # registered for masking even when the export is off
    if settings.otel is False or (_env("OTEL_SDK_DISABLED") or "").lower() == "true":
        return None
    pinned = _environment_endpoint()
    origin, hidden = "the environment", None
    if settings.otel_endpoint:
        endpoint = _traces_url(settings.otel_endpoint)
        if _env("FLEET_OTEL_ENDPOINT") != settings.otel_endpoint.strip():  # from a file (or the caller)
            origin = _file_origin("otel_endpoint")
            hidden = pinned if pinned is not None and not _same(pinned[1], endpoint) else None
    elif pinned is not None:
        endpoint = pinned[1]
    elif settings.otel:
        endpoint = DEFAULT_ENDPOINT
    else:
        return None
    bound_to = pinned[1] if pinned is not None else DEFAULT_ENDPOINT
    sent = headers if _same(endpoint, bound_to) else {}
    protocol = _env("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or _env("OTEL_EXPORTER_OTLP_PROTOCOL") or _SUPPORTED_PROTOCOL
    return OtelTarget(
        endpoint=endpoint,
        header_names=tuple(sent),
        protocol=protocol,
        withheld=tuple(name for name in headers if name not in sent),
        bound_to=bound_to,
        hidden=hidden,
        origin=origin,
    )


def _withheld_note(target: OtelTarget) -> str:
    return (f"the OTLP headers ({', '.join(target.withheld)}) are withheld from it: they are sent only to "
            f"{shown_endpoint(target.bound_to)}, the endpoint the environment names")  # fmt: skip


def shown_endpoint(url: str) -> str:
    """The endpoint without a user name or password in it."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"{host}:{parts.port}" if parts.port else host
    return urlunsplit(parts._replace(netloc=netloc))


def telemetry_check(settings: Settings) -> dict[str, Any]:
    """The doctor's line: off, or where spans go (header names only), and whether a file setting hides
    the endpoint the environment names (the spans then go elsewhere, without the environment's headers)."""
    target = otel_target(settings)
    if target is None:
        pinned = _environment_endpoint()
        if settings.otel is False and pinned is not None and not _env("FLEET_OTEL"):
            where = _file_origin("otel")
            return {"ok": False,
                    "detail": f"OpenTelemetry export off: otel = false in {where} hides the collector {pinned[0]} "
                              f"names ({shown_endpoint(pinned[1])})",
                    "fix": _undo("otel", where)}  # fmt: skip
        return {"ok": True, "detail": "OpenTelemetry export off (set OTEL_EXPORTER_OTLP_ENDPOINT or FLEET_OTEL=true)"}
    headers = f", headers: {', '.join(target.header_names)}" if target.header_names else ""
    detail = f"OpenTelemetry spans to {shown_endpoint(target.endpoint)} (OTLP/HTTP{headers})"
    if target.hidden is not None:
        variable, url = target.hidden
        detail += f": otel_endpoint in {target.origin} hides the collector {variable} names ({shown_endpoint(url)})"
        if target.withheld:
            detail += f"; {_withheld_note(target)}"
        return {"ok": False, "detail": detail, "fix": _undo("otel_endpoint", target.origin)}
    if target.withheld:
        return {"ok": False, "detail": f"{detail}: {_withheld_note(target)}",
                "fix": "name this collector in the environment (OTEL_EXPORTER_OTLP_ENDPOINT) if the headers are "
                       f"for it, or {_undo('otel_endpoint', target.origin)}"}  # fmt: skip
    if target.protocol != _SUPPORTED_PROTOCOL:
        return {
            "ok": False,
            "detail": f"{detail}: protocol {target.protocol} is not supported, spans go as {_SUPPORTED_PROTOCOL}",
            "fix": "set OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf",
        }
    return {"ok": True, "detail": detail}


def _undo(name: str, where: str) -> str:
    """How to remove a file's setting, said for the file it is in."""
    if where == ".env":
        return f"remove FLEET_{name.upper()} from .env in this folder"
    return f"run `fleet-rlm config unset {name}` (it is set in {where})"


def start_telemetry(settings: Settings, store: Store) -> Telemetry | None:
    """Export this process's runs from the store's committed (already redacted) events; None when off."""
    target = otel_target(settings)
    if target is None:
        return None
    from fleet_rlm.core.otel_export import SpanExport

    if target.withheld:  # names and URLs only: no value of a header
        log.warning("OpenTelemetry spans go to %s: %s", shown_endpoint(target.endpoint), _withheld_note(target))
    headers = otlp_headers()
    export = SpanExport(target.endpoint, {name: headers[name] for name in target.header_names})
    store.add_listener(export.offer)
    return export
