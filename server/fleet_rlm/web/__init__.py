"""The web face: ``fleet web`` serves the JSON API, SSE streams, the static UI and MCP at ``/mcp``
from one Starlette app over the process's Engine (``create_app``); ``serve`` runs it. A thin
adapter: every read goes through ``engine.workspace``, every rule lives in core.

Nothing is re-exported here: callers import ``fleet_rlm.web.app``, so importing any web module does not
pull in the whole app (whose routes import the web modules back)."""
