"""Volume tools: named folders that outlive runs (memory/, artifacts/, buffers/, meta/).

Each volume call runs in a worker thread: with Daytona volumes it is network I/O, which must not
hold up the event loop (and every other request of this server) meanwhile."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Annotated, Any

import anyio
from mcp.types import ToolAnnotations
from pydantic import Field

from fleet_rlm.core.volume_operations import MAX_ENTRIES
from fleet_rlm.mcp.models import FileContent, FileList, VolumeList, WrittenFile
from fleet_rlm.mcp.views import user_errors

if TYPE_CHECKING:
    from mcp.server import MCPServer

    from fleet_rlm.mcp.provider import EngineProvider

MAX_READ = 1024 * 1024
WRITABLE_ROOTS = ("memory", "artifacts")

Volume = Annotated[str, Field(min_length=1, description="Volume name (see list_volumes).")]


def volume_resource_uri(volume: str, path: str) -> str:
    return f"fleet://volumes/{volume}/{path}"


def register(server: MCPServer[Any], provider: EngineProvider) -> None:
    read_only = ToolAnnotations(
        read_only_hint=True, destructive_hint=False, idempotent_hint=True, open_world_hint=False
    )

    @server.tool(
        title="List volumes",
        description=(
            "Volumes are named folders that outlive runs: a run can read them (context_paths "
            "'vol:<name>/<path>') and keep notes in memory/ and results in artifacts/."
        ),
        annotations=read_only,
    )
    async def list_volumes() -> VolumeList:
        with user_errors():
            engine = await provider.get()
            return await anyio.to_thread.run_sync(engine.workspace.volume_list)

    @server.tool(
        title="List files in a volume",
        description=f"Files and folders under a path of a volume (at most {MAX_ENTRIES} entries).",
        annotations=read_only,
    )
    async def list_files(
        volume: Volume,
        path: Annotated[str, Field(description="Folder inside the volume; '' for its top.")] = "",
        recursive: Annotated[bool, Field(description="Include everything below, not just direct entries.")] = False,
    ) -> FileList:
        with user_errors():
            engine = await provider.get()
            return await anyio.to_thread.run_sync(engine.workspace.files, volume, path, recursive)

    @server.tool(
        title="Read a file from a volume",
        description=(
            "Read a text file from a volume, a byte range at a time. The result says the file's "
            "total size and, if it continues, the offset to read on from. For answering questions "
            "over a big file, pass it to run instead of reading it all."
        ),
        annotations=read_only,
    )
    async def read_file(
        volume: Volume,
        path: Annotated[str, Field(min_length=1, description="File path inside the volume, e.g. 'memory/notes.md'.")],
        offset: Annotated[int, Field(ge=0, description="Byte offset to start at.")] = 0,
        length: Annotated[int, Field(ge=1, le=MAX_READ, description="Bytes to read at most.")] = 65536,
    ) -> FileContent:
        with user_errors():
            engine = await provider.get()
            shown = await anyio.to_thread.run_sync(engine.workspace.text, volume, path, offset, length)
        return FileContent(**shown.model_dump(), uri=volume_resource_uri(volume, path))

    @server.tool(
        title="Write a file to a volume",
        description=(
            "Write (create or replace) a UTF-8 text file in a volume; the volume is created if "
            "needed. Only paths under memory/ (notes to reuse) and artifacts/ (results) are allowed."
        ),
        annotations=ToolAnnotations(
            read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False
        ),
    )
    async def write_file(
        volume: Volume,
        path: Annotated[str, Field(min_length=1, description="'memory/<file>' or 'artifacts/<file>'.")],
        content: Annotated[str, Field(description="The whole new text of the file.")],
    ) -> WrittenFile:
        with user_errors():
            engine = await provider.get()
            write = functools.partial(engine.workspace.write_file, volume, path, content, roots=WRITABLE_ROOTS)
            entry = await anyio.to_thread.run_sync(write)
        rel = entry.path
        return WrittenFile(
            volume=volume,
            path=rel,
            size=entry.size,
            uri=volume_resource_uri(volume, rel),
            ref=f"vol:{volume}/{rel}",
        )
