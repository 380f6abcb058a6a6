"""Web pages and a git repository as a run's context: fetched under the fetch policy, before staging.

Each page is saved in the run's host-only scratch folder (no sandbox sees it) under a name that says
what it is (``page-1.html``, ``page-2.pdf``), so staging converts it like any document, and staging
shows it by its URL; a repository is cloned there (shallow, ``.git`` removed afterwards) and staged
like a folder, its files shown as ``URL@REF/path``. Every fetch is a ``context.fetched`` event; a fetch
that fails fails the run with ``cannot fetch URL: <reason>`` before its sandbox starts.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from fleet_rlm.core.inputs.documents import DOCUMENT_SUFFIXES, document_kind
from fleet_rlm.core.inputs.fetch import fetch, is_html, is_text
from fleet_rlm.core.inputs.repo import clone, tree_size
from fleet_rlm.errors import FleetError
from fleet_rlm.types import CONTEXT_FETCHED, RunRequest

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

Emit = Callable[..., Any]
ACCEPT = "text/html, application/xhtml+xml, application/pdf, text/plain;q=0.9, */*;q=0.5"
SNIFF = 8192
# Media types of documents staging converts, as the file suffix that makes it convert them.
SUFFIX_OF_TYPE = {
    "text/html": ".html",
    "application/xhtml+xml": ".html",
    "application/pdf": ".pdf",
    "application/vnd.openxmlformats-officedocument.wordprocessingml.document": ".docx",
    "application/vnd.openxmlformats-officedocument.presentationml.presentation": ".pptx",
    "application/vnd.openxmlformats-officedocument.spreadsheetml.sheet": ".xlsx",
    "application/epub+zip": ".epub",
    "application/x-ipynb+json": ".ipynb",
}


async def fetch_sources(req: RunRequest, settings: Settings, folder: Path, emit: Emit) -> list[tuple[str, Path]]:
    """Fetch the request's pages and repository into ``folder`` (made here, private); for staging,
    each one's name in ``sources`` and where it is on the host. Nothing to fetch: nothing made."""
    urls = list(dict.fromkeys(req.context_urls))
    if not urls and req.repo_url is None:
        return []
    folder.mkdir(mode=0o700)
    named = [await _page(url, index, settings, folder, emit) for index, url in enumerate(urls, 1)]
    if req.repo_url is not None:
        named.append(await _repo(req.repo_url, req.repo_ref, settings, folder, emit))
    return named


def _cannot(url: str, exc: FleetError) -> FleetError:
    """The same kind of error, saying which source and why (the URL once, not twice)."""
    reason = exc.message.removeprefix(f"'{url}' ")
    return type(exc)(f"cannot fetch {url}: {reason}")


async def _page(url: str, index: int, settings: Settings, folder: Path, emit: Emit) -> tuple[str, Path]:
    try:
        page = await fetch(url, settings, max_mb=settings.fetch_max_mb, limit_setting="fetch_max_mb", accept=ACCEPT)
    except FleetError as exc:
        raise _cannot(url, exc) from None
    path = folder / f"page-{index}{_suffix(page.content_type, page.url)}"
    data = page.body
    kind = document_kind(path.name, data[:SNIFF])  # staging tells it by this file's name, not the URL's
    if kind is None and (is_text(page.content_type) or is_html(page.content_type)):
        # Text as the server encoded it, saved as UTF-8 (what staging reads).
        data = page.body.decode(page.encoding or "utf-8", errors="replace").encode()
    await asyncio.to_thread(_write_private, path, data)
    emit(
        CONTEXT_FETCHED,
        {
            "url": url,
            "kind": "page",
            "name": url,
            "bytes": len(page.body),
            "seconds": page.seconds,
            "status": page.status,
            "content_type": page.content_type,
            "final_url": page.url,
        },
    )
    return url, path


def _suffix(content_type: str, url: str) -> str:
    """The suffix that makes staging read the page as what the server says it is."""
    if content_type in SUFFIX_OF_TYPE:
        return SUFFIX_OF_TYPE[content_type]
    named = PurePosixPath(urlsplit(url).path).suffix.lower()
    if named in DOCUMENT_SUFFIXES or named in (".csv", ".md", ".rst", ".json", ".xml"):
        return named  # a notebook or office file served as text/plain or application/octet-stream
    if content_type.startswith("image/"):
        return "." + content_type.rsplit("/", 1)[1]  # kept as an image, told by its first bytes
    return ".txt" if is_text(content_type) else ".bin"  # staging skips a binary one, saying so


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)


async def _repo(url: str, ref: str | None, settings: Settings, folder: Path, emit: Emit) -> tuple[str, Path]:
    into = folder / "repo"
    into.mkdir(mode=0o700)
    started = time.monotonic()
    try:
        work = await clone(url, ref, settings, into, max_mb=settings.fetch_max_mb, limit_setting="fetch_max_mb")
    except FleetError as exc:
        raise _cannot(url, exc) from None
    seconds = round(time.monotonic() - started, 3)

    def tidy() -> tuple[int, int]:  # staging reads the files, never git's own
        shutil.rmtree(work / ".git", ignore_errors=True)
        shutil.rmtree(into / "home", ignore_errors=True)
        return sum(len(files) for _root, _dirs, files in os.walk(work)), tree_size(work)

    files, size = await asyncio.to_thread(tidy)
    name = f"{url}@{ref}" if ref else url
    emit(
        CONTEXT_FETCHED,
        {"url": url, "kind": "repo", "name": name, "bytes": size, "seconds": seconds, "ref": ref, "files": files},
    )
    return name, work
