"""The browser UI: static files with no build step, served openly (they hold no data).

Looked up in the installed package first (``fleet_rlm/web/ui``, where the wheel puts the repo's
``webui/``), then in a source checkout (``webui/`` at the repo root).
"""

from __future__ import annotations

from pathlib import Path

from starlette.requests import Request
from starlette.responses import FileResponse, HTMLResponse, Response
from starlette.routing import BaseRoute, Mount, Route
from starlette.staticfiles import StaticFiles

PACKAGED = Path(__file__).resolve().parent / "ui"
CHECKOUT = Path(__file__).resolve().parents[3] / "webui"
MISSING = (
    "<!doctype html><meta charset=utf-8><title>fleet-rlm</title><h1>fleet-rlm</h1>"
    "<p>The web UI files are missing from this installation: reinstall fleet-rlm. "
    "The API answers at <code>/api</code> (see <code>/openapi.json</code>) and MCP at <code>/mcp</code>.</p>"
)


def ui_folder() -> Path | None:
    for folder in (PACKAGED, CHECKOUT):
        if (folder / "index.html").is_file():
            return folder
    return None


def is_open(path: str) -> bool:
    """Paths anyone may GET: the page and its files (the API behind them needs the token)."""
    return path == "/" or path.startswith("/static/")


def routes(folder: Path | None) -> list[BaseRoute]:
    async def index(_request: Request) -> Response:
        if folder is None:
            return HTMLResponse(MISSING)
        return FileResponse(folder / "index.html", headers={"cache-control": "no-cache"})

    found: list[BaseRoute] = [Route("/", index, include_in_schema=False)]
    if folder is not None:
        found.append(Mount("/static", StaticFiles(directory=folder / "static", check_dir=False), name="static"))
    return found
