"""``/openapi.json``: the OpenAPI 3.1 document of the API, built from the same route table that
builds the routes (``web.api.Endpoint``), plus the routes served around it (``/health``, the
browser session exchange, ``/mcp``)."""

from __future__ import annotations

import functools
import re
from typing import Any

from pydantic import BaseModel
from pydantic.json_schema import models_json_schema

from fleet_rlm import __version__
from fleet_rlm.http_auth import SESSION_IDLE_SECONDS
from fleet_rlm.web.api import Endpoint
from fleet_rlm.web.models import Error, Health

REF = "#/components/schemas/{model}"
IDLE_HOURS = SESSION_IDLE_SECONDS // 3600
ERROR_TEXT = {
    400: "The request is wrong; the message says how to fix it.",
    401: "Missing or wrong token (send the bearer token or a browser session id).",
    404: "Not found.",
    409: "Clashes with the current state.",
    413: "Too large (upload_max_mb).",
    503: "The runtime is not available.",
}
AUTH_BODY = {"type": "object", "properties": {"token": {"type": "string"}}, "required": ["token"]}
SESSION = {
    "type": "object",
    "properties": {"session": {"type": ["string", "null"], "description": "Send as `Authorization: Bearer`; "
                               "null when the server runs without authentication."}},
    "required": ["session"],
}  # fmt: skip


def _error_responses(codes: tuple[int, ...]) -> dict[str, Any]:
    content = {"application/json": {"schema": {"$ref": REF.format(model="Error")}}}
    return {str(c): {"description": ERROR_TEXT.get(c, "Error."), "content": content} for c in codes}


def _query_parameters(model: type[BaseModel]) -> list[dict[str, Any]]:
    schema = model.model_json_schema()
    required = set(schema.get("required", []))
    return [
        {"name": name, "in": "query", "required": name in required, "schema": prop,
         **({"description": prop["description"]} if "description" in prop else {})}
        for name, prop in schema.get("properties", {}).items()
    ]  # fmt: skip


def _path_parameters(path: str) -> list[dict[str, Any]]:
    return [
        {"name": name, "in": "path", "required": True, "schema": {"type": "string", "minLength": 1}}
        for name in re.findall(r"{(\w+)}", path)
    ]


def _operation(e: Endpoint, refs: dict[tuple[type[BaseModel], str], dict[str, Any]]) -> dict[str, Any]:
    op: dict[str, Any] = {
        "summary": e.summary,
        "operationId": f"{e.method.lower()}_{e.handler.__name__}",
        "tags": [e.tag],
        "parameters": _path_parameters(e.path) + (_query_parameters(e.query) if e.query else []),
    }
    if e.body_kind == "json" and e.body is not None:
        schema = refs[(e.body, "validation")]
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    elif e.body_kind == "object":
        schema = {"type": "object", "additionalProperties": True, "description": "setting name -> new value"}
        op["requestBody"] = {"required": True, "content": {"application/json": {"schema": schema}}}
    elif e.body_kind == "multipart":
        files = {"type": "array", "items": {"type": "string", "contentMediaType": "application/octet-stream"}}
        schema = {"type": "object", "properties": {"file": files}, "required": ["file"]}
        op["requestBody"] = {"required": True, "content": {"multipart/form-data": {"schema": schema}}}
    elif e.body_kind == "binary":
        schema = {"type": "string", "contentMediaType": "application/octet-stream"}
        op["requestBody"] = {"required": True, "content": {"application/octet-stream": {"schema": schema}}}
    if e.status == 204:
        ok: dict[str, Any] = {"description": "Done."}
    elif e.response is not None:
        ok = {"description": "OK.", "content": {e.media_type: {"schema": refs[(e.response, "serialization")]}}}
    elif e.media_type == "application/json":
        ok = {"description": "OK.", "content": {"application/json": {"schema": {"type": "object"}}}}
    else:
        ok = {"description": "OK.", "content": {e.media_type: {"schema": {"type": "string"}}}}
    op["responses"] = {str(e.status): ok, **_error_responses((*e.errors, 401, 503))}
    return op


@functools.cache  # built on first request, not at launch: /health must answer at once
def document(endpoints: tuple[Endpoint, ...], *, mcp: bool) -> dict[str, Any]:
    pairs = [(e.body, "validation") for e in endpoints if e.body is not None]
    pairs += [(e.response, "serialization") for e in endpoints if e.response is not None]
    pairs += [(Error, "serialization"), (Health, "serialization")]
    unique = list(dict.fromkeys(pairs))
    refs, defs = models_json_schema(unique, ref_template=REF)  # type: ignore[arg-type]
    paths: dict[str, dict[str, Any]] = {}
    for e in endpoints:
        paths.setdefault(e.path, {})[e.method.lower()] = _operation(e, refs)  # type: ignore[arg-type]
    up = {"description": "Up.", "content": {"application/json": {"schema": refs[(Health, "serialization")]}}}
    paths["/health"] = {"get": {
        "summary": "Liveness, open to all (says nothing but that the server is up)", "operationId": "get_health",
        "tags": ["system"], "security": [], "responses": {"200": up},
    }}  # fmt: skip
    paths["/api/auth"] = {
        "post": {
            "summary": f"Trade the token for a browser session id (no cookie; ends after {IDLE_HOURS} idle hours)",
            "operationId": "post_auth", "tags": ["auth"], "security": [],
            "requestBody": {"required": True, "content": {"application/json": {"schema": AUTH_BODY}}},
            "responses": {"200": {"description": "Signed in.", "content": {"application/json": {"schema": SESSION}}},
                          **_error_responses((400, 401))},
        },
        "delete": {
            "summary": "Sign out: revokes the session id sent as the bearer", "operationId": "delete_auth",
            "tags": ["auth"], "security": [], "responses": {"204": {"description": "Signed out."}},
        },
    }  # fmt: skip
    if mcp:
        paths["/mcp"] = {
            method: {
                "summary": "MCP over Streamable HTTP (the same server as `fleet-mcp --transport http`)",
                "operationId": f"{method}_mcp", "tags": ["mcp"],
                "responses": {"200": {"description": "MCP JSON-RPC or an SSE stream."}, **_error_responses((400,))},
            }
            for method in ("get", "post", "delete")
        }  # fmt: skip
    return {
        "openapi": "3.1.0",
        "info": {"title": "fleet-rlm", "version": __version__,
                 "description": "The JSON API of `fleet web`: runs, traces, events (SSE), volumes, settings."},
        "paths": paths,
        "components": {
            "schemas": defs.get("$defs", {}),
            "securitySchemes": {
                "bearer": {"type": "http", "scheme": "bearer",
                           "description": "The token `fleet web` printed, or a session id from POST /api/auth."},
            },
        },
        "security": [{"bearer": []}],
    }  # fmt: skip
