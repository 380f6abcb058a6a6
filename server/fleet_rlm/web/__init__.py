"""The web face: ``fleet web`` serves the JSON API, SSE streams, the static UI and MCP at ``/mcp``
from one Starlette app over the process's Engine (``create_app``); ``serve`` runs it. A thin
adapter: every read goes through ``engine.workspace``, every rule lives in core."""

from fleet_rlm.web.app import create_app

__all__ = ["create_app"]
