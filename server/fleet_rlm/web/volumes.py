"""Volumes: list, tree, read, download, upload, delete, create. File I/O runs off the event loop,
and every call is the workspace's (``core.volume_operations``: no link followed, no escape from the volume)."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from urllib.parse import quote

from starlette.responses import StreamingResponse

from fleet_rlm.core import views
from fleet_rlm.volumes import DURABLE_ROOTS
from fleet_rlm.web import models as m
from fleet_rlm.web.api import Call, Routes, read_limited

routes = Routes("volumes")
CHUNK = 256 * 1024


@routes.add("GET", "/api/volumes", "Volumes with their size and quota", response=views.VolumeList)
async def list_volumes(call: Call) -> views.VolumeList:
    return await asyncio.to_thread(call.engine.workspace.volume_list)


@routes.add("POST", "/api/volumes", "Create a volume (with memory/, artifacts/, buffers/, meta/)",
            body=m.VolumeCreate, response=m.VolumeCreated, status=201)  # fmt: skip
async def create_volume(call: Call) -> m.VolumeCreated:
    await asyncio.to_thread(call.engine.workspace.create_volume, call.body.name)
    return m.VolumeCreated(name=call.body.name)


@routes.add("DELETE", "/api/volumes/{name}", "Delete a volume and every file in it", status=204)
async def delete_volume(call: Call) -> None:
    await asyncio.to_thread(call.engine.workspace.delete_volume, call.path["name"])


@routes.add("GET", "/api/volumes/{name}/files", "Files under a path of a volume", query=m.FilesQuery,
            response=views.FileList)  # fmt: skip
async def files(call: Call) -> views.FileList:
    q: m.FilesQuery = call.query
    return await asyncio.to_thread(call.engine.workspace.files, call.path["name"], q.path, q.recursive)


@routes.add("GET", "/api/volumes/{name}/text", "A byte range of a text file", query=m.TextQuery,
            response=views.TextRange)  # fmt: skip
async def text(call: Call) -> views.TextRange:
    q: m.TextQuery = call.query
    return await asyncio.to_thread(call.engine.workspace.text, call.path["name"], q.path, q.offset, q.length)


@routes.add("GET", "/api/volumes/{name}/raw", "Download a file", query=m.PathQuery,
            media_type="application/octet-stream")  # fmt: skip
async def download(call: Call) -> StreamingResponse:
    name, path = call.path["name"], call.query.path
    fd, info = await asyncio.to_thread(call.engine.workspace.open_file, name, path)  # the fd, never the path again

    def chunks() -> Iterator[bytes]:
        with os.fdopen(fd, "rb") as f:
            while chunk := f.read(CHUNK):
                yield chunk

    filename = path.rstrip("/").rsplit("/", 1)[-1]
    headers = {
        "content-disposition": f"attachment; filename*=UTF-8''{quote(filename, safe='')}",
        "content-length": str(info.st_size),
    }
    return StreamingResponse(chunks(), media_type="application/octet-stream", headers=headers)


@routes.add("PUT", "/api/volumes/{name}/raw", "Upload a file (the body is its bytes) under a durable folder",
            query=m.PathQuery, body_kind="binary", response=views.FileEntry, errors=(400, 404, 413))  # fmt: skip
async def put_file(call: Call) -> views.FileEntry:
    data = await read_limited(call.request, call.engine.settings)
    return await asyncio.to_thread(
        call.engine.workspace.write_file, call.path["name"], call.query.path, data, roots=DURABLE_ROOTS
    )


@routes.add("DELETE", "/api/volumes/{name}/raw", "Delete a file, link or empty folder", query=m.PathQuery,
            status=204)  # fmt: skip
async def delete_file(call: Call) -> None:
    await asyncio.to_thread(call.engine.workspace.delete_file, call.path["name"], call.query.path)
