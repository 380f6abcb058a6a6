"""Daytona volumes: each fleet volume NAME is the Daytona volume ``<prefix>NAME``, with the same
durable roots (memory/, artifacts/, buffers/, meta/) behind the same ``base.Volumes`` contract as
local volumes, so the CLI, MCP and web faces browse them unchanged.

Daytona has no file API on volumes themselves, only inside sandboxes, so the host reads and writes
through one small *browser* sandbox (labelled ``fleet-rlm.kind=volumes``) that mounts every fleet
volume at ``/home/daytona/volumes/NAME``; it is reused, started when stopped, and made again when
a new volume appears. Paths are resolved there, inside Daytona: a link planted by sandboxed code
can only lead to the browser sandbox's own files, never the host's. Listings come from ``find``
(links reported as links, never followed); reads are streamed and bounded.

The methods are synchronous like local volumes'; they run on a private event loop (with its
own Daytona client), so they may be called from any thread, including an event loop's.

Limits: Daytona volumes have no fleet quota enforcement after each step (Daytona's own storage
limits apply); ``enforce_quota`` reports nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import shlex
import tempfile
import threading
from collections.abc import Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from fleet_rlm.sandbox import daytona_client as dc
from fleet_rlm.volumes.base import Expect, register_volumes
from fleet_rlm.volumes.paths import (
    DURABLE_ROOTS,
    check_volume_name,
    delete_parts,
    is_volume_name,
    path_parts,
    write_parts,
)
from fleet_rlm.volumes.quota import Usage, volume_quota
from fleet_rlm.volumes.safepath import VolumeChanged, VolumeError, VolumeNotFound

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

T = TypeVar("T")
MAX_READ = 512 * 1024 * 1024  # largest file the host reads from a volume
MAX_LISTING = 64 * 1024 * 1024  # largest `find` output accepted
CALL_TIMEOUT = 600.0
BROWSER_STOP_MINUTES = 5
_TYPES = {"f": "file", "d": "dir", "l": "link"}


class DaytonaVolumes:
    """Fleet volumes kept in Daytona; see the module docstring."""

    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.quota = volume_quota(settings)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="daytona-volumes", daemon=True)
        self._thread.start()
        self._browser: Any = None
        self._daytona: Any = None
        self._guard: asyncio.Lock | None = None

    check_name = staticmethod(check_volume_name)

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        if threading.current_thread() is self._thread:
            raise RuntimeError("DaytonaVolumes called from its own loop")
        return asyncio.run_coroutine_threadsafe(self._guarded(coro), self._loop).result(CALL_TIMEOUT)

    async def _guarded(self, coro: Coroutine[Any, Any, T]) -> T:
        from daytona import DaytonaError

        if self._guard is None:
            self._guard = asyncio.Lock()
        try:
            async with self._guard:  # one browser sandbox, one operation at a time
                return await coro
        except DaytonaError as exc:
            if dc.status_of(exc) == 404:
                raise VolumeNotFound(f"not found in Daytona: {exc}") from None
            raise VolumeError(dc.explain(exc, "reach the volumes")) from None

    # -- the browser sandbox --------------------------------------------------------------------

    async def _client(self) -> Any:
        if self._daytona is None:  # this loop's client, held as long as the loop lives
            self._daytona = await dc.acquire_client(self.settings)
        return self._daytona

    async def _fleet_volumes(self) -> dict[str, Any]:
        """Fleet volume name -> Daytona volume, for every ready volume with our prefix."""
        daytona = await self._client()
        found = await dc.retrying(lambda: daytona.volume.list(), safe=True)
        prefix = self.settings.daytona_volume_prefix
        out = {}
        for vol in found:
            name = vol.name[len(prefix) :] if vol.name.startswith(prefix) else ""
            if is_volume_name(name) and str(getattr(vol.state, "value", vol.state)) == "ready":
                out[name] = vol
        return out

    async def _sandbox(self, need: str | None = None) -> Any:
        """The browser sandbox, mounting every fleet volume (``need`` must be among them)."""
        from daytona import CreateSandboxFromSnapshotParams, ListSandboxesQuery, VolumeMount

        daytona = await self._client()
        volumes = await self._fleet_volumes()
        if need is not None and need not in volumes:
            raise VolumeNotFound(f"no volume {need!r}")
        wanted = {v.id for v in volumes.values()}
        box = self._browser
        if box is None:
            query = ListSandboxesQuery(labels={dc.MANAGED: "true", dc.KIND: "volumes"})
            async for found in daytona.list(query):
                box = found
                break
        if box is not None:
            await dc.retrying(lambda: box.refresh_data(), safe=True)
            mounted = {m.volume_id for m in (box.volumes or [])}
            if not wanted <= mounted:  # a volume made since: mounts are fixed at create
                await dc.retrying(lambda: box.delete(), safe=True)
                box = None
        if box is None:
            snapshot = await dc.ensure_snapshot(daytona, self.settings)
            mounts = [VolumeMount(volume_id=v.id, mount_path=f"{dc.VOLUME_ROOT}/{n}") for n, v in volumes.items()]
            params = CreateSandboxFromSnapshotParams(
                snapshot=snapshot, language="python", labels=dc.labels("volumes", **{dc.OWNER: "shared"}),
                network_block_all=True, auto_stop_interval=BROWSER_STOP_MINUTES, auto_delete_interval=60,
                volumes=mounts,
            )  # fmt: skip
            box = await dc.retrying(lambda: daytona.create(params, timeout=180), safe=False)
        elif str(getattr(box.state, "value", box.state)) != "started":
            await dc.retrying(lambda: box.start(timeout=180), safe=True)  # stopped: started, not recovered
        self._browser = box
        return box

    def _abs(self, name: str, parts: list[str]) -> str:
        return "/".join([dc.VOLUME_ROOT, name, *parts])

    async def _find(self, name: str, parts: list[str], *, depth: str) -> list[tuple[str, int, float, str]]:
        """(type, size, mtime, relative path) rows from ``find`` in the browser sandbox."""
        box = await self._sandbox(name)
        target = shlex.quote(self._abs(name, parts))
        cmd = f"find {target} {depth} -printf '%y\\t%s\\t%T@\\t%P\\0' 2>/dev/null; echo \"$?\""
        response = await dc.retrying(lambda: box.process.exec(cmd, timeout=120), safe=True)
        text = str(response.result or "")
        if len(text) > MAX_LISTING:
            raise VolumeError(f"volume {name!r} lists more than {MAX_LISTING >> 20} MB of entries; list a subfolder")
        body, _, status = text.rpartition("\0")
        if status.strip() not in ("0", "") or (not body and depth == "-maxdepth 0"):
            raise VolumeNotFound(f"no file {'/'.join(parts)!r} in volume {name!r}")
        rows = []
        for record in (body + "\0").split("\0")[:-1]:
            fields = record.split("\t", 3)
            if len(fields) != 4:
                continue
            with contextlib.suppress(ValueError):
                rows.append((_TYPES.get(fields[0], "other"), int(fields[1]), float(fields[2]), fields[3]))
        return rows

    @staticmethod
    def _entry(row: tuple[str, int, float, str], base: list[str]) -> dict[str, Any]:
        kind, size, mtime, rel = row
        path = "/".join([*base, rel] if rel else base)
        return {"path": path, "type": kind, "size": size if kind == "file" else 0, "mtime": mtime}

    # -- volumes --------------------------------------------------------------------------------

    def names(self) -> list[str]:
        return sorted(self._run(self._fleet_volumes()))

    def list_volumes(self) -> list[dict[str, Any]]:
        async def usage_of_all() -> list[dict[str, Any]]:
            volumes = await self._fleet_volumes()
            if not volumes:
                return []
            return [{**(await self._usage(n)).__dict__, "name": n} for n in sorted(volumes)]

        return [{**row, "quota_bytes": self.quota.max_bytes, "max_files": self.quota.max_files}
                for row in self._run(usage_of_all())]  # fmt: skip

    async def _usage(self, name: str) -> Usage:
        rows = await self._find(name, [], depth="-mindepth 1")
        rows = [r for r in rows if not (r[0] == "dir" and r[3] in DURABLE_ROOTS)]
        return Usage(len(rows), sum(r[1] for r in rows if r[0] == "file"))

    def usage(self, name: str) -> Usage:
        self.check_name(name)
        return self._run(self._usage(name))

    def ensure(self, name: str) -> Path:
        """Create the volume (ready, with its durable roots) if missing; the Path is nominal."""
        self.check_name(name)

        async def make() -> None:
            await dc.ensure_volume(await self._client(), self.settings, name)
            box = await self._sandbox(name)
            roots = " ".join(shlex.quote(self._abs(name, [r])) for r in DURABLE_ROOTS)
            await dc.retrying(lambda: box.process.exec(f"mkdir -p {roots}", timeout=60), safe=True)

        self._run(make())
        return self.path(name)

    def path(self, name: str) -> Path:
        """Where sandboxes see the volume; the host has no folder for it."""
        self.check_name(name)
        return Path(dc.VOLUME_ROOT) / name

    def delete_volume(self, name: str) -> None:
        self.check_name(name)

        async def delete() -> None:
            volumes = await self._fleet_volumes()
            if name not in volumes:
                raise VolumeNotFound(f"no volume {name!r}")
            if self._browser is not None:  # it mounts the volume; the next call makes a new one
                await dc.retrying(lambda: self._browser.delete(), safe=True)
                self._browser = None
            daytona = await self._client()
            await dc.retrying(lambda: daytona.volume.delete(volumes[name]), safe=True)

        self._run(delete())

    def enforce_quota(self, name: str, since: float) -> str | None:
        return None  # see the module docstring: Daytona's storage limits apply

    # -- files ----------------------------------------------------------------------------------

    def stat(self, name: str, path: str) -> dict[str, Any]:
        parts = path_parts(name, path)
        rows = self._run(self._find(name, parts, depth="-maxdepth 0"))
        return self._entry(rows[0], parts)

    def list_files(self, name: str, path: str = "", recursive: bool = False) -> list[dict[str, Any]]:
        parts = path_parts(name, path)
        if self.stat(name, path)["type"] != "dir":
            raise VolumeError(f"{path!r} in volume {name!r} is not a folder")
        depth = "-mindepth 1" if recursive else "-mindepth 1 -maxdepth 1"
        rows = self._run(self._find(name, parts, depth=depth))
        return sorted((self._entry(r, parts) for r in rows), key=lambda e: e["path"])

    def read(self, name: str, path: str, offset: int = 0, length: int | None = None) -> bytes:
        if offset < 0 or (length is not None and length < 0):
            raise VolumeError("offset and length must not be negative")
        entry = self.stat(name, path)
        if entry["type"] != "file":
            raise VolumeError(f"{path!r} in volume {name!r} is a {entry['type']}, not a regular file")
        want = MAX_READ if length is None else min(offset + length, MAX_READ)
        if length is None and entry["size"] > MAX_READ:
            raise VolumeError(f"{path!r} is over {MAX_READ >> 20} MB: read it in ranges (offset, length)")

        async def fetch() -> bytes:
            box = await self._sandbox(name)
            data = bytearray()
            stream = await box.fs.download_file_stream(self._abs(name, path_parts(name, path)))
            async for chunk in stream:  # bounded: the file may have grown since the stat
                data.extend(chunk)
                if len(data) >= want:
                    break
            return bytes(data[offset:want])

        return self._run(fetch())

    def read_text(self, name: str, path: str, offset: int = 0, length: int | None = None) -> str:
        return self.read(name, path, offset, length).decode("utf-8", errors="replace")

    def open_file(self, name: str, path: str) -> tuple[int, os.stat_result]:
        """A host-private copy of the file, as an fd (and its fstat); the caller closes it."""
        data = self.read(name, path)
        with tempfile.TemporaryFile() as fh:  # unlinked at once: only this fd reaches it
            fh.write(data)
            fh.flush()
            fd = os.dup(fh.fileno())
        os.lseek(fd, 0, os.SEEK_SET)
        return fd, os.fstat(fd)

    def write(
        self,
        name: str,
        path: str,
        data: bytes | str,
        *,
        roots: tuple[str, ...] | None = None,
        expect: Expect | None = None,
    ) -> dict[str, Any]:
        parts = write_parts(name, path, roots)
        payload = data.encode("utf-8") if isinstance(data, str) else bytes(data)
        self.ensure(name)
        if expect is not None:  # checked, then uploaded: a remote volume offers no atomic check-and-write
            self._check_expected(name, path, expect)

        async def upload() -> None:
            box = await self._sandbox(name)
            await dc.retrying(lambda: box.fs.upload_file(payload, self._abs(name, parts)), safe=True)

        self._run(upload())
        return self.stat(name, path)

    def _check_expected(self, name: str, path: str, expect: Expect) -> None:
        try:
            entry: dict[str, Any] | None = self.stat(name, path)
        except VolumeNotFound:
            entry = None
        if expect.sha256 is None:
            if entry is not None:
                raise VolumeChanged(f"{path!r} in volume {name!r} changed: it exists now")
            return
        if (
            entry is None
            or entry["type"] != "file"
            or hashlib.sha256(self.read(name, path)).hexdigest() != expect.sha256
        ):
            raise VolumeChanged(f"{path!r} in volume {name!r} changed: it is not the file expected")

    def delete(self, name: str, path: str) -> None:
        parts = delete_parts(name, path)
        entry = self.stat(name, path)

        async def remove() -> None:
            box = await self._sandbox(name)
            target = shlex.quote(self._abs(name, parts))
            # rmdir refuses a non-empty folder; rm -f on a link removes the link, never its target
            cmd = f"rmdir -- {target}" if entry["type"] == "dir" else f"rm -f -- {target}"
            response = await dc.retrying(lambda: box.process.exec(cmd, timeout=60), safe=True)
            if response.exit_code:
                raise VolumeError(f"cannot delete {path!r} in volume {name!r}: {str(response.result)[:200].strip()}")

        self._run(remove())


register_volumes("daytona", DaytonaVolumes)
