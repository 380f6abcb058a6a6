"""Every error the web app answers, mapped in one place: JSON ``{"error", "message"}`` with the
status the error hierarchy names (``FleetError.http_status``), never a stack trace. An error a
setting fixes (``ConfigError``) adds ``"hint": "settings"``: the browser links it to its Settings page."""

from __future__ import annotations

import logging

from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse, Response

from fleet_rlm.config import ConfigError
from fleet_rlm.errors import FleetError
from fleet_rlm.redaction import redact_text

log = logging.getLogger(__name__)

KINDS = {
    400: "bad_request",
    401: "unauthorized",
    403: "forbidden",
    404: "not_found",
    405: "method_not_allowed",
    409: "conflict",
    413: "too_large",
    421: "misdirected",
    500: "internal",
    503: "unavailable",
}


def error_response(
    status: int, message: str, headers: dict[str, str] | None = None, hint: str | None = None
) -> JSONResponse:
    body = {"error": KINDS.get(status, "error"), "message": redact_text(message)}
    if hint:
        body["hint"] = hint
    return JSONResponse(body, status_code=status, headers=headers)


async def fleet_error(_request: Request, exc: Exception) -> Response:
    assert isinstance(exc, FleetError)
    return error_response(exc.http_status, exc.message, hint="settings" if isinstance(exc, ConfigError) else None)


async def http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    if exc.status_code == 404:
        message = f"nothing at {request.url.path}: /openapi.json lists every route"
    elif exc.status_code == 405:
        message = f"{request.method} is not allowed on {request.url.path}: /openapi.json lists the methods"
    else:
        message = str(exc.detail)
    return error_response(exc.status_code, message, dict(exc.headers or {}))


async def client_gone(request: Request, _exc: Exception) -> Response:
    """The client closed the connection before its request was read: nothing failed, nobody reads the reply."""
    log.info("%s %s: the client went away before sending its whole request", request.method, request.url.path)
    return Response(status_code=400)


async def internal_error(request: Request, exc: Exception) -> Response:
    """A bug or an outage: logged here in full, answered with one line."""
    log.error("%s %s failed", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error (a bug): the server log has the details; please report it")


HANDLERS = {
    FleetError: fleet_error, HTTPException: http_error, ClientDisconnect: client_gone, Exception: internal_error
}
