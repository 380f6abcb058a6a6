"""The tool surface: frozen by a snapshot, the same in both eras, and well described."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm import __version__
from fleet_rlm.mcp.server import INSTRUCTIONS
from mcp import Client
from tests.mcp import EXPECTED_TOOLS
from tests.support.oracle_lm import OracleLM, Scenario

pytestmark = pytest.mark.anyio

SNAPSHOT = Path(__file__).parent / "snapshots" / "tools.json"
EXPECTED = EXPECTED_TOOLS


def surface(tools: list[Any]) -> list[dict[str, Any]]:
    return [
        {
            "name": t.name,
            "title": t.title,
            "description": t.description,
            "input_schema": t.input_schema,
            "output_schema": t.output_schema,
            "annotations": t.annotations.model_dump(mode="json", exclude_none=True) if t.annotations else None,
        }
        for t in tools
    ]


async def test_tool_list_matches_snapshot(client: Client) -> None:
    current = surface((await client.list_tools()).tools)
    if os.environ.get("UPDATE_SNAPSHOTS") == "1":
        SNAPSHOT.write_text(json.dumps(current, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    assert SNAPSHOT.exists(), "no snapshot yet: run with UPDATE_SNAPSHOTS=1 and review the file"
    # Exact: names, schemas, descriptions and annotations are the contract with every client.
    assert current == json.loads(SNAPSHOT.read_text(encoding="utf-8"))


async def test_every_tool_is_described_typed_and_annotated(client: Client) -> None:
    tools = (await client.list_tools()).tools
    assert [t.name for t in tools] == EXPECTED
    for tool in tools:
        assert tool.description and len(tool.description) > 40, tool.name
        assert tool.output_schema and tool.output_schema["type"] == "object", tool.name
        assert tool.annotations is not None, tool.name
        hints = (tool.annotations.read_only_hint, tool.annotations.destructive_hint,
                 tool.annotations.idempotent_hint, tool.annotations.open_world_hint)  # fmt: skip
        assert None not in hints, tool.name
        for name, prop in tool.input_schema.get("properties", {}).items():
            assert prop.get("description"), f"{tool.name}.{name} has no description"
    by_name = {t.name: t for t in tools}
    assert by_name["read_file"].annotations.read_only_hint is True  # type: ignore[union-attr]
    assert by_name["write_file"].annotations.destructive_hint is True  # type: ignore[union-attr]
    assert by_name["run"].annotations.open_world_hint is True  # type: ignore[union-attr]
    assert "ctx" not in json.dumps(by_name["run"].input_schema)  # the Context parameter stays hidden
    assert by_name["run"].input_schema["required"] == ["question"]


async def test_server_identity(client: Client, era: str) -> None:
    assert client.protocol_version == ("2025-11-25" if era == "legacy" else "2026-07-28")
    info = client.server_info
    assert info is not None and info.name == "fleet-rlm" and info.version == __version__
    assert client.instructions == INSTRUCTIONS and "too large for your context" in INSTRUCTIONS
    caps = client.server_capabilities
    assert caps.tools is not None and caps.prompts is not None
    assert caps.resources is not None and caps.resources.subscribe is True


async def test_list_runs_pages(client: Client) -> None:
    empty = (await client.call_tool("list_runs", {})).structured_content
    assert empty == {"runs": [], "offset": 0, "has_more": False}
    bad = await client.call_tool("list_runs", {"status": "exploded"})
    assert bad.is_error


async def test_doctor_offline(client: Client, fleet_env: dict[str, str]) -> None:
    result = await client.call_tool("doctor", {})
    report = result.structured_content
    assert report is not None and not result.is_error
    assert set(report["checks"]) >= {"model", "sandbox", "keyring", "store"}
    model = report["checks"]["model"]
    assert model["ok"] is True and "openai/oracle" in model["detail"] and "not contacted" in model["detail"]
    assert report["ok"] == all(c["ok"] for c in report["checks"].values())


async def test_doctor_online_contacts_the_model(client: Client, oracle: Any) -> None:
    report = (await client.call_tool("doctor", {"offline": False})).structured_content
    assert report is not None and report["checks"]["model"]["ok"] is True
    assert "answered in" in report["checks"]["model"]["detail"]
    assert len(oracle.requests()) == 1


def test_startup_does_not_import_the_engine() -> None:
    """Clients time the handshake: dspy/litellm (seconds to import) load on first use only."""
    code = (
        "import sys; from fleet_rlm.mcp.server import build_server; build_server(); "
        "print(sorted(m for m in ('dspy', 'litellm', 'fleet_rlm.core.engine') if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert out.stdout.strip() == "[]"


async def test_get_run_reports_the_prompt_cache(client: Client, oracle: OracleLM) -> None:
    oracle.add(Scenario("count to two", ["x = 1\nprint(x)", "SUBMIT(x + 1)"]))
    oracle.state.cache_reads = 30  # each reply reports 30 prompt tokens read from the provider's cache
    done = (await client.call_tool("run", {"question": "count to two", "context_text": "x"})).structured_content
    assert done is not None and done["status"] == "succeeded"
    state = (await client.call_tool("get_run", {"run_id": done["run_id"]})).structured_content
    assert state is not None
    assert state["usage"]["total"]["cached_tokens"] == 60 == done["usage"]["total"]["cached_tokens"]
    assert state["usage"]["by_model"]["openai/oracle"]["cached_tokens"] == 60


async def test_pin_run_marks_the_run_and_get_run_shows_it(client: Client, oracle: OracleLM) -> None:
    oracle.add(Scenario("pin me", ["SUBMIT('kept')"]))
    done = (await client.call_tool("run", {"question": "pin me", "context_text": "x"})).structured_content
    assert done is not None
    pinned = (await client.call_tool("pin_run", {"run_id": "last"})).structured_content
    assert pinned is not None and (pinned["run_id"], pinned["pinned"]) == (done["run_id"], True)
    state = (await client.call_tool("get_run", {"run_id": done["run_id"]})).structured_content
    assert state is not None and state["pinned"] is True
    unpinned = (await client.call_tool("pin_run", {"run_id": done["run_id"], "pinned": False})).structured_content
    assert unpinned is not None and unpinned["pinned"] is False
    missing = await client.call_tool("pin_run", {"run_id": "rnosuchrun0"})
    assert missing.is_error and "no run" in missing.content[0].text  # type: ignore[union-attr]


async def test_pin_run_waits_for_the_store_off_the_event_loop(
    fleet_env: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """While pin_run's write waits for the store's writer thread, the server's event loop keeps
    serving: the writer, held busy, is released only by a callback that the loop runs."""
    import asyncio
    import threading

    from fleet_rlm.core.engine import Engine
    from fleet_rlm.mcp.server import build_server
    from tests.support.run_refs import NEWEST, seed_runs

    seed_runs(Path(fleet_env["FLEET_HOME"]))
    queued, loop_ran = threading.Event(), threading.Event()
    async with Engine() as engine, Client(build_server(engine)) as client:
        store, loop = engine.workspace.store, asyncio.get_running_loop()
        update = store.runs.update

        def update_seen(*args: Any, **kwargs: Any) -> None:
            queued.set()
            update(*args, **kwargs)

        def hold_the_writer() -> bool:  # on the writer thread, ahead of pin_run's write
            queued.wait(30)  # bounds a hang, never reached when pin_run calls the store
            loop.call_soon_threadsafe(loop_ran.set)
            return loop_ran.wait(30)  # False: the loop was stuck waiting for this very thread

        monkeypatch.setattr(store.runs, "update", update_seen)
        held = asyncio.wrap_future(store.submit(hold_the_writer))
        pinned = (await client.call_tool("pin_run", {"run_id": NEWEST})).structured_content
        assert await held is True, "pin_run blocked the event loop while it waited for the store"
        assert pinned is not None and (pinned["run_id"], pinned["pinned"]) == (NEWEST, True)
