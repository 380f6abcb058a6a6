"""The route table of the JSON API: each endpoint declared once, with what the OpenAPI document
says about it (query model, body, response model), so routes and document cannot drift apart.

A handler receives a ``Call`` (the request, the Engine, parsed path/query/body) and returns a
pydantic model, a JSON-able value, or a finished Starlette ``Response``. Errors are raised, never
answered here: ``web.errors`` maps them in one place.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel, ValidationError
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from fleet_rlm.core.uploads import limit_bytes, too_large
from fleet_rlm.errors import UserError

if TYPE_CHECKING:
    from fleet_rlm.config import Settings
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.web.state import AppState

BodyKind = Literal["json", "multipart", "binary", "object"]


@dataclass
class Call:
    request: Request
    engine: Engine
    state: AppState
    path: dict[str, str]
    query: Any = None
    body: Any = None


Handler = Callable[[Call], Awaitable[Any]]


@dataclass(frozen=True)
class Endpoint:
    method: str
    path: str
    handler: Handler
    summary: str
    tag: str
    status: int = 200
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    body_kind: BodyKind | None = None
    response: type[BaseModel] | None = None
    media_type: str = "application/json"  # of a success response with a body
    errors: tuple[int, ...] = (400, 404)


@dataclass
class Routes:
    """One area's endpoints (runs, volumes, settings, system)."""

    tag: str
    endpoints: list[Endpoint] = field(default_factory=list)

    def add(self, method: str, path: str, summary: str, **options: Any) -> Callable[[Handler], Handler]:
        def register(handler: Handler) -> Handler:
            body_kind = options.pop("body_kind", "json" if options.get("body") else None)
            self.endpoints.append(Endpoint(method, path, handler, summary, self.tag, body_kind=body_kind, **options))
            return handler

        return register


def explain(exc: ValidationError, where: str) -> UserError:
    """A validation failure as one line naming each bad field."""
    parts = []
    for err in exc.errors():
        loc = ".".join(str(p) for p in err.get("loc", ())) or where
        parts.append(f"{loc}: {err.get('msg')}")
    return UserError(f"invalid {where}: " + "; ".join(parts))


async def read_limited(request: Request, settings: Settings) -> bytes:
    """The whole body, refused past ``upload_max_mb`` (checked as it arrives, not only by its header)."""
    limit = limit_bytes(settings)
    declared = request.headers.get("content-length")
    if declared and declared.isdigit() and int(declared) > limit:
        raise too_large(settings)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise too_large(settings)
    return bytes(body)


def as_response(result: Any, status: int) -> Response:
    if isinstance(result, Response):
        return result
    if status == 204:
        return Response(status_code=204)
    if isinstance(result, BaseModel):
        result = result.model_dump(mode="json")
    return JSONResponse(result, status_code=status)


def to_route(endpoint: Endpoint) -> Route:
    async def handle(request: Request) -> Response:
        state: AppState = request.app.state.fleet
        engine = await state.engine()
        call = Call(request, engine, state, dict(request.path_params))
        if endpoint.query is not None:
            try:
                given = {k: v for k, v in request.query_params.items() if v != ""}  # `status=`: no filter
                call.query = endpoint.query.model_validate(given)
            except ValidationError as exc:
                raise explain(exc, "query") from None
        if endpoint.body_kind in ("json", "object"):
            raw = await read_limited(request, engine.settings)
            try:
                data = json.loads(raw or b"null")
            except ValueError:
                raise UserError("the request body is not valid JSON") from None
            if endpoint.body is not None:
                try:
                    call.body = endpoint.body.model_validate(data)
                except ValidationError as exc:
                    raise explain(exc, "body") from None
            elif not isinstance(data, dict):
                raise UserError("the request body must be a JSON object")
            else:
                call.body = data
        return as_response(await endpoint.handler(call), endpoint.status)

    return Route(endpoint.path, handle, methods=[endpoint.method], name=f"{endpoint.method} {endpoint.path}")
