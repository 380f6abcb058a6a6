"""Volume tools and the volume file resource: writes confined, reads paged, traversal refused."""

from __future__ import annotations

import base64
import functools
import threading
from pathlib import Path
from typing import Any

import pytest
from mcp.types import ResourceTemplateReference

from fleet_rlm.volumes import LocalVolumes
from fleet_rlm.volumes.base import REGISTRY
from mcp import Client, MCPError

pytestmark = pytest.mark.anyio


def error_text(result: object) -> str:
    assert getattr(result, "is_error", False), result
    return result.content[0].text  # type: ignore[attr-defined]


async def test_write_list_read_roundtrip(client: Client) -> None:
    written = (
        await client.call_tool("write_file", {"volume": "notes", "path": "memory/todo.md", "content": "# ToDo\n- a\n"})
    ).structured_content
    assert written == {
        "volume": "notes", "path": "memory/todo.md", "size": 11,
        "uri": "fleet://volumes/notes/memory/todo.md", "ref": "vol:notes/memory/todo.md",
    }  # fmt: skip
    await client.call_tool("write_file", {"volume": "notes", "path": "artifacts/out/report.txt", "content": "r"})

    volumes = (await client.call_tool("list_volumes", {})).structured_content
    assert volumes == {"volumes": [{  # 3 entries: two files and the folder artifacts/out
        "name": "notes", "files": 3, "bytes": 12, "quota_bytes": 1024 * 1024 * 1024, "max_files": 100_000,
    }]}  # fmt: skip

    top = (await client.call_tool("list_files", {"volume": "notes"})).structured_content
    assert top is not None and [e["path"] for e in top["entries"]] == ["artifacts", "buffers", "memory", "meta"]
    deep = (await client.call_tool("list_files", {"volume": "notes", "recursive": True})).structured_content
    files = [e["path"] for e in deep["entries"] if e["type"] == "file"]  # type: ignore[index]
    assert files == ["artifacts/out/report.txt", "memory/todo.md"] and deep["truncated"] is False  # type: ignore[index]

    read = (await client.call_tool("read_file", {"volume": "notes", "path": "memory/todo.md"})).structured_content
    assert read is not None
    assert read["content"] == "# ToDo\n- a\n" and read["size"] == 11
    assert read["truncated"] is False and read["next_offset"] is None

    resource = await client.read_resource("fleet://volumes/notes/memory/todo.md")
    assert resource.contents[0].text == "# ToDo\n- a\n"  # type: ignore[union-attr]


async def test_writes_only_under_memory_and_artifacts(client: Client) -> None:
    for path in ("buffers/x.txt", "meta/info.json", "top.txt", "memory"):
        text = error_text(await client.call_tool("write_file", {"volume": "v", "path": path, "content": "x"}))
        assert "memory/" in text and "artifacts/" in text, text
    escape = error_text(await client.call_tool("write_file", {"volume": "v", "path": "memory/../../x", "content": "x"}))
    assert "escapes volume" in escape
    absolute = error_text(await client.call_tool("write_file", {"volume": "v", "path": "/etc/passwd", "content": "x"}))
    assert "absolute" in absolute
    bad_name = error_text(await client.call_tool("write_file", {"volume": "../v", "path": "memory/a", "content": "x"}))
    assert "invalid volume name" in bad_name


async def test_read_file_pages_without_splitting_characters(client: Client, fleet_env: dict[str, str]) -> None:
    text = "".join(f"line {i} – ünïcödé ✓\n" for i in range(6000))  # multi-byte characters throughout
    await client.call_tool("write_file", {"volume": "big", "path": "artifacts/big.txt", "content": text})
    size = len(text.encode())
    parts, offset, calls = [], 0, 0
    while offset is not None:
        page = (
            await client.call_tool(
                "read_file", {"volume": "big", "path": "artifacts/big.txt", "offset": offset, "length": 40_001}
            )
        ).structured_content
        assert page is not None and page["size"] == size and "\ufffd" not in page["content"]
        assert page["truncated"] == (page["next_offset"] is not None)
        parts.append(page["content"])
        offset, calls = page["next_offset"], calls + 1
    assert "".join(parts) == text
    assert -(-size // 40_001) <= calls <= -(-size // 40_001) + 1  # pages end on a character boundary


async def test_read_file_errors(client: Client, fleet_env: dict[str, str]) -> None:
    assert "no volume 'ghost'" in error_text(await client.call_tool("read_file", {"volume": "ghost", "path": "a"}))
    await client.call_tool("write_file", {"volume": "v", "path": "memory/a.txt", "content": "a"})
    assert "no file 'memory/b.txt'" in error_text(
        await client.call_tool("read_file", {"volume": "v", "path": "memory/b.txt"})
    )
    blob = Path(fleet_env["FLEET_HOME"]) / "volumes" / "v" / "artifacts" / "blob.bin"
    blob.write_bytes(b"\x00\x01\x02binary")
    assert "binary" in error_text(await client.call_tool("read_file", {"volume": "v", "path": "artifacts/blob.bin"}))
    assert "escapes" in error_text(await client.call_tool("read_file", {"volume": "v", "path": "../v/memory/a.txt"}))
    blob_resource = (await client.read_resource("fleet://volumes/v/artifacts/blob.bin")).contents[0]
    assert base64.b64decode(blob_resource.blob) == b"\x00\x01\x02binary"  # type: ignore[union-attr]


@pytest.mark.parametrize(
    "uri",
    [
        "fleet://volumes/v/../../etc/passwd",
        "fleet://volumes/v/memory/%2e%2e/%2e%2e/secret",
        "fleet://volumes/v//etc/passwd",
        "fleet://volumes/v/memory/missing.txt",
    ],
)
async def test_volume_resource_refuses_traversal(client: Client, uri: str) -> None:
    await client.call_tool("write_file", {"volume": "v", "path": "memory/a.txt", "content": "a"})
    with pytest.raises(MCPError):
        await client.read_resource(uri)


async def test_over_long_paths_are_a_tool_error_naming_the_limits(client: Client) -> None:
    await client.call_tool("write_file", {"volume": "v", "path": "memory/a.txt", "content": "a"})
    long_name = "é" * 128  # 256 bytes
    for path in (f"memory/{long_name}", "memory/" + "/".join(["d" * 200] * 16)):
        for tool, args in (
            ("read_file", {"volume": "v", "path": path}),
            ("write_file", {"volume": "v", "path": path, "content": "x"}),
            ("list_files", {"volume": "v", "path": path}),
        ):
            text = error_text(await client.call_tool(tool, args))
            assert "255 bytes per name" in text and "3,072 bytes per path" in text, (tool, text[:300])
        with pytest.raises(MCPError, match="255 bytes per name"):
            await client.read_resource(f"fleet://volumes/v/{path}")


async def test_volume_io_runs_off_the_event_loop(client: Client, monkeypatch: pytest.MonkeyPatch) -> None:
    """Daytona's volume calls are network I/O: on the event loop, one would stall every other request."""
    loop_thread = threading.get_ident()
    calls: list[tuple[str, bool]] = []  # (method, made on the event loop's thread)

    class LoopWatchingVolumes(LocalVolumes):
        def __getattribute__(self, name: str) -> Any:
            value = super().__getattribute__(name)
            if name.startswith("_") or not callable(value):
                return value

            @functools.wraps(value)
            def watched(*args: Any, **kwargs: Any) -> Any:
                calls.append((name, threading.get_ident() == loop_thread))
                return value(*args, **kwargs)

            return watched

    monkeypatch.setitem(REGISTRY, "local", LoopWatchingVolumes.from_settings)  # the engine opens on first use
    await client.call_tool("write_file", {"volume": "v", "path": "memory/a.txt", "content": "a"})
    await client.call_tool("list_volumes", {})
    await client.call_tool("list_files", {"volume": "v", "recursive": True})
    await client.call_tool("read_file", {"volume": "v", "path": "memory/a.txt"})
    await client.read_resource("fleet://volumes/v/memory/a.txt")
    file_template = ResourceTemplateReference(uri="fleet://volumes/{volume}/{+path}")
    await client.complete(file_template, {"name": "volume", "value": ""})
    await client.complete(file_template, {"name": "path", "value": ""}, {"volume": "v"})

    assert {"write", "list_volumes", "list_files", "stat", "read"} <= {name for name, _ in calls}
    assert [name for name, on_loop in calls if on_loop] == []
