"""Resumable SSE over HTTP: a priming event with `retry`, replay after Last-Event-ID, never across sessions."""

from __future__ import annotations

import json
from typing import Any

import httpx

from tests.mcp.test_http import HEADERS, INITIALIZE, serving

VERSION = "2025-11-25"


def sse_events(text: str) -> list[dict[str, str]]:
    """Parse an SSE body into events (field -> value; `data` lines joined)."""
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        event: dict[str, str] = {}
        for line in block.split("\n"):
            if not line or line.startswith(":"):
                continue
            field, _, value = line.partition(":")
            value = value[1:] if value.startswith(" ") else value
            event[field] = f"{event[field]}\n{value}" if field in event else value
        if event:
            events.append(event)
    return events


def open_session(http: httpx.Client, url: str) -> dict[str, str]:
    opened = http.post(url, json=INITIALIZE, headers=HEADERS)
    assert opened.status_code == 200, opened.text
    headers = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": VERSION}
    done = http.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers)
    assert done.status_code == 202
    return headers


def call(http: httpx.Client, url: str, headers: dict[str, str], tool: str) -> list[dict[str, str]]:
    body = {"jsonrpc": "2.0", "id": 7, "method": "tools/call", "params": {"name": tool, "arguments": {}}}
    response = http.post(url, json=body, headers=headers)
    assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
    return sse_events(response.text)


def replay(http: httpx.Client, url: str, headers: dict[str, str], last_event_id: str) -> list[dict[str, Any]]:
    """The JSON-RPC messages a reconnecting GET receives (the stream then tails live: stop at the response)."""
    get_headers = {**headers, "Accept": "text/event-stream", "Last-Event-ID": last_event_id}
    messages: list[dict[str, Any]] = []
    with http.stream("GET", url, headers=get_headers) as response:
        assert response.status_code == 200
        buffer = ""
        for chunk in response.iter_text():
            buffer += chunk
            found = [json.loads(e["data"]) for e in sse_events(buffer) if e.get("data")]
            if any("result" in m for m in found):
                return found
        messages = [json.loads(e["data"]) for e in sse_events(buffer) if e.get("data")]
    return messages


def test_streams_prime_and_resume_within_their_session_only(fleet_env: dict[str, str]) -> None:
    with serving() as url, httpx.Client(timeout=30) as http:
        a, b = open_session(http, url), open_session(http, url)
        a_events = call(http, url, a, "list_volumes")
        b_events = call(http, url, b, "list_runs")  # the same request id in another session

        priming, message = a_events[0], a_events[1]
        assert priming["id"] and priming.get("data", "") == "" and priming["retry"] == "2000"
        assert message["id"] and json.loads(message["data"])["result"]["structuredContent"] == {"volumes": []}

        # A dropped stream resumes: the response comes again, with its id.
        (resumed,) = replay(http, url, a, priming["id"])
        assert resumed["id"] == 7 and resumed["result"]["structuredContent"] == {"volumes": []}

        # Session A naming session B's event gets nothing of B's, although both streams are "7".
        assert replay(http, url, a, b_events[0]["id"]) == []
        assert replay(http, url, a, "not-an-id") == []
        (b_resumed,) = replay(http, url, b, b_events[0]["id"])
        assert "runs" in b_resumed["result"]["structuredContent"]
