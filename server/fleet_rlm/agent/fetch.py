"""Fetching a web page as text for the agent, under the product's one fetch policy (``core.inputs.fetch``:
http(s) only, public addresses unless ``fetch_allowed_hosts`` allows them, the checked address pinned,
every redirect checked again). Bodies stop at ``agent_fetch_max_mb``; HTML becomes plain text."""

from __future__ import annotations

from typing import TYPE_CHECKING

from fleet_rlm.core.inputs.fetch import (
    FetchFailed,
    FetchRefused,
    Target,
    check_url,
    fetch,
    html_to_text,
    is_html,
    is_text,
)

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

__all__ = ["FetchFailed", "FetchRefused", "Target", "check_url", "fetch_text", "html_to_text"]


async def fetch_text(url: str, settings: Settings) -> tuple[str, str]:
    """The page at ``url`` as text, and the URL it finally came from (after redirects)."""
    page = await fetch(
        url,
        settings,
        max_mb=settings.agent_fetch_max_mb,
        limit_setting="agent_fetch_max_mb",
        accept="text/html, text/plain;q=0.9, */*;q=0.1",
    )
    text = page.body.decode(page.encoding or "utf-8", errors="replace")
    if is_html(page.content_type):
        return html_to_text(text), page.url
    if is_text(page.content_type):
        return text, page.url
    raise FetchRefused(f"'{page.url}' is {page.content_type}, not text: the agent only pulls in text pages")
