"""A loopback double of the Daytona API, driven by the real ``daytona`` SDK (0.226.1) in tests.

It implements what the SDK calls for fleet-rlm: the control plane under ``/api`` (sandboxes with
their lifecycle and labels, volumes that become ready asynchronously, snapshots, preview URLs
that map a port to a loopback port) and the toolbox under ``/toolbox/<sandbox id>`` (interpreter
contexts over a WebSocket with streamed output, file upload/download and listing, ``process``
exec and sessions). Code runs in local subprocesses (``daytona_ctx.py``), one per interpreter
context, under bubblewrap so that ``/home/daytona``, ``/tmp`` and the volume mount paths are the
sandbox's own folders; ``networkBlockAll`` unshares the network. It is a test double, NOT an
isolation boundary: the rest of the host file system is visible to the code.

Faults are injected through ``POST /_double/faults`` (see ``Fault``): an HTTP status (429 with
``Retry-After``, 502, 503) on matching requests, a WebSocket dropped mid-run, a timeout close
4008, a slow create. ``GET /_double/state`` shows sandboxes, contexts and a request log.

Run on its own: ``python -m tests.support.daytona_api --port P [--api-key KEY]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import re
import shutil
import signal
import sys
import tempfile
import threading
import urllib.parse
import uuid
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from aiohttp import WSCloseCode, web

HOME = "/home/daytona"
CTX_SCRIPT = Path(__file__).with_name("daytona_ctx.py")
# Inside a box /tmp and /home are the box's own, so neither this checkout (it may live under /tmp)
# nor a virtual environment may be visible: the context script is bound in, the base interpreter runs it.
CTX_INSIDE = "/opt/fleet-daytona-double/ctx.py"
PYTHON = os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)
TIMEOUT_CLOSE = 4008
KILL_GRACE = 1.0


def _now() -> str:
    return datetime.now(UTC).isoformat().replace("+00:00", "Z")


def _error(status: int, message: str, headers: dict[str, str] | None = None, code: str | None = None) -> web.Response:
    body: dict[str, Any] = {"statusCode": status, "message": message, "error": message}
    if code:
        body.update(code=code, source="daemon")
    return web.json_response(body, status=status, headers=headers)


@dataclass
class Fault:
    """One injected fault. ``kind``: "http" (answer ``status`` to requests whose "METHOD path"
    matches ``match``), "ws_drop" (cut the WebSocket ``after`` seconds into a run), "ws_timeout"
    (time the run out ``after`` seconds in: SIGINT, a kill after a grace, close 4008),
    "slow_create" (stay ``creating`` for ``seconds``). ``times`` is how many requests it hits."""

    kind: str
    match: str = ""
    status: int = 502
    retry_after: float | None = None
    after: float = 0.0
    seconds: float = 0.0
    times: int = 1


@dataclass
class Context:
    id: str
    cwd: str
    proc: asyncio.subprocess.Process
    pid: int
    created_at: str = field(default_factory=_now)
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


@dataclass
class Box:
    id: str
    name: str
    root: Path
    snapshot: str | None
    env: dict[str, str]
    labels: dict[str, str]
    network_block_all: bool
    volumes: list[dict[str, Any]]
    auto_stop: int
    auto_delete: int
    state: str = "creating"
    created_at: str = field(default_factory=_now)
    last_activity: str = field(default_factory=_now)
    contexts: dict[str, Context] = field(default_factory=dict)
    sessions: dict[str, dict[str, Any]] = field(default_factory=dict)

    @property
    def home(self) -> Path:
        return self.root / "home"

    @property
    def tmp(self) -> Path:
        return self.root / "tmp"


class DaytonaDouble:
    """The server state and its routes. ``start()`` serves on 127.0.0.1 in this process's loop."""

    def __init__(self, data_dir: Path, api_key: str = "test-key", volume_ready_delay: float = 0.2) -> None:
        self.data = Path(data_dir)
        self.api_key = api_key
        self.volume_ready_delay = volume_ready_delay
        self.boxes: dict[str, Box] = {}
        self.volumes: dict[str, dict[str, Any]] = {}
        self.snapshots: dict[str, dict[str, Any]] = {}
        self.faults: list[Fault] = []
        self.log: list[str] = []
        self.port = 0
        self._runner: web.AppRunner | None = None
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- serving --------------------------------------------------------------------------------

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def app(self) -> web.Application:
        app = web.Application(middlewares=[self._middleware], client_max_size=1 << 30)
        a, t = "/api", "/toolbox/{sid}"
        app.add_routes([
            web.post("/_double/faults", self.add_fault),
            web.get("/_double/state", self.state),
            web.post("/_double/sandbox/{sid}/stop", self.force_stop),
            web.post(f"{a}/sandbox", self.create_sandbox),
            web.get(f"{a}/sandbox", self.list_sandboxes),
            web.get(f"{a}/sandbox/{{sid}}", self.get_sandbox),
            web.delete(f"{a}/sandbox/{{sid}}", self.delete_sandbox),
            web.post(f"{a}/sandbox/{{sid}}/start", self.start_sandbox),
            web.post(f"{a}/sandbox/{{sid}}/stop", self.stop_sandbox),
            web.post(f"{a}/sandbox/{{sid}}/{{what:autostop|autodelete|autoarchive}}/{{n}}", self.set_interval),
            web.post(f"{a}/sandbox/{{sid}}/last-activity", self.touch),
            web.put(f"{a}/sandbox/{{sid}}/labels", self.set_labels),
            web.get(f"{a}/sandbox/{{sid}}/toolbox-proxy-url", self.toolbox_url),
            web.get(f"{a}/sandbox/{{sid}}/ports/{{port}}/preview-url", self.preview_url),
            web.post(f"{a}/volumes", self.create_volume),
            web.get(f"{a}/volumes", self.list_volumes),
            web.get(f"{a}/volumes/by-name/{{name}}", self.volume_by_name),
            web.get(f"{a}/volumes/{{vid}}", self.get_volume),
            web.delete(f"{a}/volumes/{{vid}}", self.delete_volume),
            web.post(f"{a}/snapshots", self.create_snapshot),
            web.get(f"{a}/snapshots", self.list_snapshots),
            web.get(f"{a}/snapshots/{{ref}}", self.get_snapshot),
            web.delete(f"{a}/snapshots/{{ref}}", self.delete_snapshot),
            web.get(f"{t}/process/interpreter/execute", self.execute_ws),
            web.post(f"{t}/process/interpreter/context", self.create_context),
            web.get(f"{t}/process/interpreter/context", self.list_contexts),
            web.delete(f"{t}/process/interpreter/context/{{cid}}", self.delete_context),
            web.post(f"{t}/process/execute", self.process_execute),
            web.post(f"{t}/process/session", self.create_session),
            web.get(f"{t}/process/session", self.list_sessions),
            web.delete(f"{t}/process/session/{{sess}}", self.delete_session),
            web.post(f"{t}/process/session/{{sess}}/exec", self.session_exec),
            web.get(f"{t}/process/session/{{sess}}/command/{{cmd}}", self.session_command),
            web.get(f"{t}/process/session/{{sess}}/command/{{cmd}}/logs", self.session_logs),
            web.post(f"{t}/files/bulk-upload", self.upload),
            web.post(f"{t}/files/bulk-download", self.download),
            web.get(f"{t}/files", self.list_files),
            web.get(f"{t}/files/info", self.file_info),
            web.delete(f"{t}/files", self.delete_file),
            web.post(f"{t}/files/folder", self.create_folder),
            web.get(f"{t}/work-dir", self.work_dir),
            web.get(f"{t}/user-home-dir", self.work_dir),
        ])  # fmt: skip
        return app

    async def start(self, port: int = 0) -> None:
        if shutil.which("bwrap") is None:
            raise RuntimeError("the Daytona double needs bubblewrap (apt-get install bubblewrap)")
        self.data.mkdir(parents=True, exist_ok=True)
        self._runner = web.AppRunner(self.app(), access_log=None)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", port)
        await site.start()
        self.port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]

    async def stop(self) -> None:
        for box in list(self.boxes.values()):
            await self._kill_contexts(box)
        for task in list(self._tasks):
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    @web.middleware
    async def _middleware(self, request: web.Request, handler: Any) -> web.StreamResponse:
        path = request.path
        if path.startswith("/_double"):
            return await handler(request)
        self.log.append(f"{request.method} {path}")
        if request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return _error(401, "Unauthorized: invalid API key")
        fault = self._take("http", f"{request.method} {path}")
        if fault is not None:
            headers = {}
            if fault.retry_after is not None:
                headers = {
                    "Retry-After": f"{fault.retry_after:g}",
                    "Retry-After-authenticated": f"{fault.retry_after:g}",
                }
            return _error(fault.status, f"injected {fault.status}", headers)
        sid = request.match_info.get("sid")
        if sid is not None and path.startswith("/toolbox/"):
            box = self.boxes.get(sid)
            if box is None:
                return _error(404, f"sandbox {sid} not found")
            if box.state != "started":
                return _error(502, f"bad gateway: sandbox {sid} is {box.state}")
            box.last_activity = _now()
        return await handler(request)

    def _take(self, kind: str, target: str = "") -> Fault | None:
        for fault in self.faults:
            if fault.kind == kind and fault.times > 0 and re.search(fault.match, target):
                fault.times -= 1
                return fault
        return None

    # -- test control -----------------------------------------------------------------------------

    async def add_fault(self, request: web.Request) -> web.Response:
        self.faults.append(Fault(**await request.json()))
        return web.json_response({"ok": True})

    async def state(self, request: web.Request) -> web.Response:
        boxes = [
            {**self._dto(b), "contexts": sorted(b.contexts)} for b in self.boxes.values() if b.state != "destroyed"
        ]
        return web.json_response({
            "sandboxes": boxes, "volumes": list(self.volumes.values()), "snapshots": list(self.snapshots.values()),
            "log": self.log,
        })  # fmt: skip

    async def force_stop(self, request: web.Request) -> web.Response:
        """What an auto-stop does: the sandbox stops and its interpreter contexts die."""
        box = self._box(request)
        await self._kill_contexts(box)
        box.state = "stopped"
        return web.json_response(self._dto(box))

    # -- sandboxes ---------------------------------------------------------------------------------

    def _box(self, request: web.Request) -> Box:
        ref = request.match_info["sid"]
        for box in self.boxes.values():
            if ref in (box.id, box.name) and box.state != "destroyed":
                return box
        raise web.HTTPNotFound(
            text=json.dumps({"statusCode": 404, "message": f"Sandbox with ID or name {ref} not found"}),
            content_type="application/json",
        )

    def _dto(self, box: Box) -> dict[str, Any]:
        return {
            "id": box.id, "organizationId": "org-double", "name": box.name, "snapshot": box.snapshot,
            "user": "daytona", "env": box.env, "labels": box.labels, "public": False,
            "networkBlockAll": box.network_block_all, "kvm": False, "target": "local", "cpu": 1, "gpu": 0,
            "memory": 1, "disk": 3, "state": box.state, "errorReason": None, "autoStopInterval": box.auto_stop,
            "autoArchiveInterval": 10080, "autoDeleteInterval": box.auto_delete, "volumes": box.volumes,
            "createdAt": box.created_at, "updatedAt": _now(), "lastActivityAt": box.last_activity,
            "toolboxProxyUrl": f"http://127.0.0.1:{self.port}/toolbox",
        }  # fmt: skip

    async def create_sandbox(self, request: web.Request) -> web.Response:
        body = await request.json()
        snap = body.get("snapshot")
        if snap is not None:
            found = self._snapshot(snap)
            if found is None:
                return _error(404, f"Snapshot {snap} not found. Did you add it through the Daytona Dashboard?")
            if found["state"] != "active":
                return _error(400, f"Snapshot {snap} is {found['state']}")
        mounts = []
        for vol in body.get("volumes") or []:
            found = self._volume(vol["volumeId"])
            if found is None:
                return _error(404, f"Volume {vol['volumeId']} not found")
            if found["state"] != "ready":
                return _error(400, f"Volume {vol['volumeId']} is not in a ready state (state: {found['state']})")
            mounts.append({"volumeId": found["id"], "mountPath": vol["mountPath"], "subpath": vol.get("subpath")})
        sid = uuid.uuid4().hex[:12]
        name = body.get("name") or sid
        if any(b.name == name and b.state != "destroyed" for b in self.boxes.values()):
            return _error(409, f"Sandbox with name {name} already exists")
        box = Box(
            id=sid, name=name, root=self.data / "sandboxes" / sid, snapshot=snap, env=body.get("env") or {},
            labels=body.get("labels") or {}, network_block_all=bool(body.get("networkBlockAll")), volumes=mounts,
            auto_stop=body.get("autoStopInterval", 15), auto_delete=body.get("autoDeleteInterval", -1),
        )  # fmt: skip
        box.home.mkdir(parents=True)
        box.tmp.mkdir()
        self.boxes[sid] = box
        slow = self._take("slow_create")
        if slow is None:
            box.state = "started"
        else:
            self._spawn(self._become(box, "started", slow.seconds))
        return web.json_response(self._dto(box))

    async def _become(self, box: Box, state: str, delay: float) -> None:
        await asyncio.sleep(delay)
        if box.state != "destroyed":
            box.state = state

    async def list_sandboxes(self, request: web.Request) -> web.Response:
        wanted = json.loads(request.query.get("labels") or "{}")
        items = [
            self._dto(b)
            for b in self.boxes.values()
            if b.state != "destroyed" and all(b.labels.get(k) == v for k, v in wanted.items())
        ]
        return web.json_response({"items": items, "nextCursor": None})

    async def get_sandbox(self, request: web.Request) -> web.Response:
        return web.json_response(self._dto(self._box(request)))

    async def delete_sandbox(self, request: web.Request) -> web.Response:
        box = self._box(request)
        await self._kill_contexts(box)
        box.state = "destroyed"
        shutil.rmtree(box.root, ignore_errors=True)
        return web.json_response(self._dto(box))

    async def start_sandbox(self, request: web.Request) -> web.Response:
        box = self._box(request)
        if box.state in ("stopped", "started"):
            box.state = "started"
        return web.json_response(self._dto(box))

    async def stop_sandbox(self, request: web.Request) -> web.Response:
        return await self.force_stop(request)

    async def set_interval(self, request: web.Request) -> web.Response:
        box = self._box(request)
        n = int(request.match_info["n"])
        if request.match_info["what"] == "autostop":
            box.auto_stop = n
        elif request.match_info["what"] == "autodelete":
            box.auto_delete = n
        return web.json_response(self._dto(box))

    async def touch(self, request: web.Request) -> web.Response:
        self._box(request).last_activity = _now()
        return web.Response(status=201)

    async def set_labels(self, request: web.Request) -> web.Response:
        box = self._box(request)
        box.labels = (await request.json())["labels"]
        return web.json_response({"labels": box.labels})

    async def toolbox_url(self, request: web.Request) -> web.Response:
        self._box(request)
        return web.json_response({"url": f"http://127.0.0.1:{self.port}/toolbox"})

    async def preview_url(self, request: web.Request) -> web.Response:
        box = self._box(request)  # the sandbox shares the host's loopback (unless its network is cut)
        port = int(request.match_info["port"])
        return web.json_response({"sandboxId": box.id, "url": f"http://127.0.0.1:{port}", "token": uuid.uuid4().hex})

    # -- volumes and snapshots ---------------------------------------------------------------------

    def _volume(self, ref: str) -> dict[str, Any] | None:
        return next((v for v in self.volumes.values() if ref in (v["id"], v["name"])), None)

    async def create_volume(self, request: web.Request) -> web.Response:
        name = (await request.json())["name"]
        if self._volume(name) is not None:
            return _error(409, f"Volume with name {name} already exists")
        vid = uuid.uuid4().hex[:12]
        vol = {"id": vid, "name": name, "organizationId": "org-double", "state": "pending_create",
               "createdAt": _now(), "updatedAt": _now(), "lastUsedAt": None, "errorReason": None}  # fmt: skip
        (self.data / "volumes" / vid).mkdir(parents=True)
        self.volumes[vid] = vol
        self._spawn(self._volume_ready(vol))
        return web.json_response(vol)

    async def _volume_ready(self, vol: dict[str, Any]) -> None:
        await asyncio.sleep(self.volume_ready_delay / 2)
        vol["state"] = "creating"
        await asyncio.sleep(self.volume_ready_delay / 2)
        vol["state"] = "ready"

    async def list_volumes(self, request: web.Request) -> web.Response:
        return web.json_response(list(self.volumes.values()))

    async def volume_by_name(self, request: web.Request) -> web.Response:
        vol = self._volume(request.match_info["name"])
        if vol is None:
            return _error(404, f"Volume with name {request.match_info['name']} not found")
        return web.json_response(vol)

    async def get_volume(self, request: web.Request) -> web.Response:
        vol = self._volume(request.match_info["vid"])
        return web.json_response(vol) if vol else _error(404, "Volume not found")

    async def delete_volume(self, request: web.Request) -> web.Response:
        vol = self._volume(request.match_info["vid"])
        if vol is None:
            return _error(404, "Volume not found")
        if any(m["volumeId"] == vol["id"] for b in self.boxes.values() if b.state != "destroyed" for m in b.volumes):
            return _error(409, f"Volume {vol['name']} is in use by a sandbox")
        del self.volumes[vol["id"]]
        shutil.rmtree(self.data / "volumes" / vol["id"], ignore_errors=True)
        return web.Response()

    def _snapshot(self, ref: str) -> dict[str, Any] | None:
        return next((s for s in self.snapshots.values() if ref in (s["id"], s["name"])), None)

    async def create_snapshot(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self._snapshot(body["name"]) is not None:
            return _error(409, f"Snapshot {body['name']} already exists")
        snap = {
            "id": uuid.uuid4().hex[:12], "organizationId": "org-double", "general": False, "name": body["name"],
            "imageName": body.get("imageName"), "state": "active", "size": 0.1, "entrypoint": None, "cpu": 1,
            "gpu": 0, "mem": 1, "disk": 3, "errorReason": None, "createdAt": _now(), "updatedAt": _now(),
            "lastUsedAt": None, "sourceSandboxId": None,
            "buildInfo": body.get("buildInfo") and {**body["buildInfo"], "createdAt": _now(), "updatedAt": _now(),
                                                    "snapshotRef": body["name"]},
        }  # fmt: skip
        self.snapshots[snap["id"]] = snap
        return web.json_response(snap)

    async def list_snapshots(self, request: web.Request) -> web.Response:
        items = list(self.snapshots.values())
        return web.json_response({"items": items, "total": len(items), "page": 1, "totalPages": 1})

    async def get_snapshot(self, request: web.Request) -> web.Response:
        snap = self._snapshot(request.match_info["ref"])
        return web.json_response(snap) if snap else _error(404, f"Snapshot {request.match_info['ref']} not found")

    async def delete_snapshot(self, request: web.Request) -> web.Response:
        snap = self._snapshot(request.match_info["ref"])
        if snap is None:
            return _error(404, "Snapshot not found")
        del self.snapshots[snap["id"]]
        return web.Response()

    # -- the sandbox's view: bubblewrap, paths ----------------------------------------------------

    def _mounts(self, box: Box) -> list[tuple[str, Path]]:
        """(sandbox path, host folder), longest first."""
        mounts = [(m["mountPath"].rstrip("/"), self.data / "volumes" / m["volumeId"]) for m in box.volumes]
        mounts += [(HOME, box.home), ("/tmp", box.tmp)]
        return sorted(mounts, key=lambda m: -len(m[0]))

    def _host_path(self, box: Box, path: str) -> Path:
        if not path.startswith("/"):
            path = f"{HOME}/{path}"
        path = os.path.normpath(path)
        for inside, host in self._mounts(box):
            if path == inside or path.startswith(inside + "/"):
                return host / path[len(inside) :].lstrip("/")
        raise web.HTTPBadRequest(
            text=json.dumps({"statusCode": 400, "message": f"invalid path {path}", "code": "INVALID_FILE_PATH",
                             "source": "daemon"}),
            content_type="application/json",
        )  # fmt: skip

    def _bwrap(self, box: Box, argv: list[str], env: dict[str, str] | None = None) -> list[str]:
        cmd = ["bwrap", "--dev-bind", "/", "/", "--tmpfs", "/home"]
        for entry in os.scandir("/home"):  # keep the host's other homes (a checkout may live there)
            if entry.name != "daytona" and entry.is_dir(follow_symlinks=False):
                cmd += ["--dev-bind", entry.path, entry.path]
        cmd += ["--bind", str(box.home), HOME, "--bind", str(box.tmp), "/tmp"]
        for inside, host in self._mounts(box):
            if inside not in (HOME, "/tmp"):
                cmd += ["--bind", str(host), inside]
        cmd += ["--ro-bind", str(CTX_SCRIPT), CTX_INSIDE]
        cmd += ["--die-with-parent", "--clearenv", "--chdir", HOME]
        variables = {"HOME": HOME, "PATH": "/usr/local/bin:/usr/bin:/bin", "LANG": "C.UTF-8", **box.env, **(env or {})}
        for key, value in variables.items():
            cmd += ["--setenv", key, value]
        if box.network_block_all:
            cmd.append("--unshare-net")
        return [*cmd, "--", *argv]

    async def _context(self, box: Box, cid: str, cwd: str) -> Context:
        proc = await asyncio.create_subprocess_exec(
            *self._bwrap(box, [PYTHON, "-I", "-u", CTX_INSIDE]),
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=1 << 26, start_new_session=True,
        )  # fmt: skip
        assert proc.stdout is not None
        ready = json.loads(await asyncio.wait_for(proc.stdout.readline(), 30))
        ctx = Context(cid, cwd, proc, ready["pid"])
        box.contexts[cid] = ctx
        return ctx

    async def _kill_contexts(self, box: Box) -> None:
        for ctx in list(box.contexts.values()):
            await self._kill(box, ctx)
        for sess in box.sessions.values():
            for cmd in sess["commands"].values():
                with contextlib.suppress(ProcessLookupError):
                    cmd["proc"].kill()

    async def _kill(self, box: Box, ctx: Context) -> None:
        box.contexts.pop(ctx.id, None)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ctx.proc.pid, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await asyncio.wait_for(ctx.proc.wait(), 5)

    # -- interpreter -------------------------------------------------------------------------------

    def _ctx_dto(self, ctx: Context) -> dict[str, Any]:
        return {"id": ctx.id, "cwd": ctx.cwd, "language": "python", "active": True, "createdAt": ctx.created_at}

    async def create_context(self, request: web.Request) -> web.Response:
        box = self._box(request)
        body = await request.json() if request.can_read_body else {}
        ctx = await self._context(box, uuid.uuid4().hex[:12], (body or {}).get("cwd") or HOME)
        return web.json_response(self._ctx_dto(ctx))

    async def list_contexts(self, request: web.Request) -> web.Response:
        box = self._box(request)
        return web.json_response({"contexts": [self._ctx_dto(c) for c in box.contexts.values() if c.id != "default"]})

    async def delete_context(self, request: web.Request) -> web.Response:
        box = self._box(request)
        ctx = box.contexts.get(request.match_info["cid"])
        if ctx is None:
            return _error(404, "context not found")
        await self._kill(box, ctx)
        return web.json_response({"message": "context deleted"})

    async def execute_ws(self, request: web.Request) -> web.WebSocketResponse:
        box = self._box(request)
        ws = web.WebSocketResponse(max_msg_size=0)
        await ws.prepare(request)
        req = json.loads((await ws.receive()).data)
        cid = req.get("contextId") or "default"
        ctx = box.contexts.get(cid)
        if ctx is None and cid == "default":
            ctx = await self._context(box, "default", HOME)
        if ctx is None:
            await ws.send_str(json.dumps({"type": "error", "name": "ContextNotFound", "value": cid, "traceback": ""}))
            await ws.close()
            return ws
        timeout = req.get("timeout", 600) or None
        drop, expire = self._take("ws_drop"), self._take("ws_timeout")
        async with ctx.lock:
            assert ctx.proc.stdin is not None and ctx.proc.stdout is not None
            ctx.proc.stdin.write((json.dumps({"code": req["code"]}) + "\n").encode())
            await ctx.proc.stdin.drain()
            started = asyncio.get_running_loop().time()
            deadline = None if timeout is None else started + timeout
            if expire is not None:  # the daemon's timeout, ``after`` seconds into the run
                deadline = started + expire.after
            live = True
            while True:
                if live and drop is not None and asyncio.get_running_loop().time() - started >= drop.after:
                    live = False  # the connection is cut; the code goes on running in its context
                    request.transport.abort()  # type: ignore[union-attr]
                wait = None if deadline is None else max(0.0, deadline - asyncio.get_running_loop().time())
                if drop is not None and live:
                    wait = min(wait if wait is not None else 1e9, 0.05)
                try:
                    line = await asyncio.wait_for(ctx.proc.stdout.readline(), wait)
                except TimeoutError:
                    if deadline is not None and asyncio.get_running_loop().time() >= deadline:
                        survived = await self._interrupt(box, ctx)
                        if live:
                            await ws.close(code=TIMEOUT_CLOSE, message=b"execution timed out")
                        if not survived:
                            await self._kill(box, ctx)
                        return ws
                    continue
                if not line:  # the context's process died (killed, out of memory)
                    box.contexts.pop(ctx.id, None)
                    if live:
                        await ws.close(code=WSCloseCode.INTERNAL_ERROR, message=b"interpreter context exited")
                    return ws
                message = json.loads(line)
                if message.get("type") == "done":
                    break
                if live:
                    await ws.send_str(line.decode().rstrip("\n"))
        if live:
            await ws.close()
        return ws

    async def _interrupt(self, box: Box, ctx: Context) -> bool:
        """SIGINT, then (after a grace) the context is killed; True if the cell ended in time."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(ctx.pid, signal.SIGINT)  # the interpreter only: SIGINT would end bubblewrap
        assert ctx.proc.stdout is not None
        end = asyncio.get_running_loop().time() + KILL_GRACE
        while (left := end - asyncio.get_running_loop().time()) > 0:
            try:
                line = await asyncio.wait_for(ctx.proc.stdout.readline(), left)
            except TimeoutError:
                break
            if not line:
                return False
            if json.loads(line).get("type") == "done":
                return True
        return False

    # -- process -------------------------------------------------------------------------------------

    async def _run(self, box: Box, command: str, cwd: str | None, timeout: float | None) -> tuple[int, bytes, bytes]:
        workdir = cwd or HOME
        proc = await asyncio.create_subprocess_exec(
            *self._bwrap(box, ["sh", "-c", f"cd {json.dumps(workdir)} && {command}"]),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        try:
            out, err = await asyncio.wait_for(proc.communicate(), timeout or None)
        except TimeoutError:
            os.killpg(proc.pid, signal.SIGKILL)
            out, err = await proc.communicate()
            return -1, out, err
        return proc.returncode or 0, out, err

    async def process_execute(self, request: web.Request) -> web.Response:
        box = self._box(request)
        body = await request.json()
        code, out, err = await self._run(box, body["command"], body.get("cwd"), body.get("timeout"))
        return web.json_response({"exitCode": code, "result": (out + err).decode("utf-8", "replace")})

    async def create_session(self, request: web.Request) -> web.Response:
        box = self._box(request)
        sess = (await request.json())["sessionId"]
        box.sessions[sess] = {"sessionId": sess, "commands": {}}
        return web.Response(status=201)

    def _sess(self, box: Box, request: web.Request) -> dict[str, Any]:
        sess = box.sessions.get(request.match_info["sess"])
        if sess is None:
            raise web.HTTPNotFound(text=json.dumps({"statusCode": 404, "message": "session not found"}))
        return sess

    async def list_sessions(self, request: web.Request) -> web.Response:
        box = self._box(request)
        return web.json_response([
            {"sessionId": s["sessionId"], "commands": [self._cmd_dto(c) for c in s["commands"].values()]}
            for s in box.sessions.values()
        ])  # fmt: skip

    async def delete_session(self, request: web.Request) -> web.Response:
        box = self._box(request)
        sess = box.sessions.pop(request.match_info["sess"], None)
        for cmd in (sess or {"commands": {}})["commands"].values():
            with contextlib.suppress(ProcessLookupError):
                os.killpg(cmd["proc"].pid, signal.SIGKILL)
        return web.Response(status=204)

    @staticmethod
    def _cmd_dto(cmd: dict[str, Any]) -> dict[str, Any]:
        return {"id": cmd["id"], "command": cmd["command"], "exitCode": cmd["proc"].returncode}

    async def session_exec(self, request: web.Request) -> web.Response:
        box = self._box(request)
        sess = self._sess(box, request)
        body = await request.json()
        proc = await asyncio.create_subprocess_exec(
            *self._bwrap(box, ["sh", "-c", body["command"]]),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        cmd = {"id": uuid.uuid4().hex[:12], "command": body["command"], "proc": proc, "out": bytearray(),
               "err": bytearray()}  # fmt: skip
        sess["commands"][cmd["id"]] = cmd
        reader = asyncio.gather(self._drain(proc.stdout, cmd["out"]), self._drain(proc.stderr, cmd["err"]))
        if body.get("runAsync") or body.get("async"):
            self._spawn(reader)
            return web.json_response({"cmdId": cmd["id"]})
        await reader
        await proc.wait()
        out, err = cmd["out"].decode("utf-8", "replace"), cmd["err"].decode("utf-8", "replace")
        return web.json_response({"cmdId": cmd["id"], "exitCode": proc.returncode, "output": out + err,
                                  "stdout": out, "stderr": err})  # fmt: skip

    @staticmethod
    async def _drain(stream: asyncio.StreamReader | None, into: bytearray) -> None:
        assert stream is not None
        while chunk := await stream.read(65536):
            into.extend(chunk)

    async def session_command(self, request: web.Request) -> web.Response:
        box = self._box(request)
        cmd = self._sess(box, request)["commands"].get(request.match_info["cmd"])
        return web.json_response(self._cmd_dto(cmd)) if cmd else _error(404, "command not found")

    async def session_logs(self, request: web.Request) -> web.Response:
        box = self._box(request)
        cmd = self._sess(box, request)["commands"].get(request.match_info["cmd"])
        if cmd is None:
            return _error(404, "command not found")
        out, err = cmd["out"].decode("utf-8", "replace"), cmd["err"].decode("utf-8", "replace")
        return web.json_response({"output": out + err, "stdout": out, "stderr": err})

    # -- files -------------------------------------------------------------------------------------

    async def upload(self, request: web.Request) -> web.Response:
        box = self._box(request)
        reader = await request.multipart()
        files, paths = [], {}
        while (part := await reader.next()) is not None:
            name = part.name or ""
            if name.endswith(".path"):  # files[i].path comes before files[i].file
                paths[name[: -len(".path")]] = (await part.text()).strip()
                continue
            if not name.endswith(".file"):
                await part.read()
                continue
            target = paths.get(name[: -len(".file")]) or urllib.parse.unquote(part.filename or "")
            dest = self._host_path(box, target)
            dest.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=dest.parent, prefix=".upload-")
            with os.fdopen(fd, "wb") as out:
                while chunk := await part.read_chunk(1 << 20):
                    out.write(chunk)
            os.replace(tmp, dest)  # readers never see half a file
            files.append({"path": target})
        return web.json_response({"files": files, "errors": []})

    async def download(self, request: web.Request) -> web.StreamResponse:
        box = self._box(request)
        paths = (await request.json())["paths"]
        boundary = uuid.uuid4().hex
        resp = web.StreamResponse(headers={"Content-Type": f"multipart/form-data; boundary={boundary}"})
        await resp.prepare(request)
        for path in paths:
            # Both forms, as the daemon sends them: bulk downloads read filename*, streams filename.
            encoded = urllib.parse.quote(path, safe="/._-")
            plain = path.replace("\\", "\\\\").replace('"', '\\"')
            names = f"filename=\"{plain}\"; filename*=utf-8''{encoded}"
            try:
                data = await asyncio.to_thread(self._host_path(box, path).read_bytes)
                head = f'Content-Disposition: form-data; name="file"; {names}\r\n'
                head += "Content-Type: application/octet-stream\r\n\r\n"
            except (OSError, web.HTTPException) as exc:
                code = "FILE_NOT_FOUND" if isinstance(exc, FileNotFoundError) else "FILE_READ_FAILED"
                status = 404 if code == "FILE_NOT_FOUND" else 400
                why = exc.strerror if isinstance(exc, OSError) else str(exc)
                data = json.dumps({"message": f"{path}: {why}", "statusCode": status, "code": code, "source": "daemon"})
                data = data.encode()
                head = f'Content-Disposition: form-data; name="error"; {names}\r\n'
                head += "Content-Type: application/json\r\n\r\n"
            await resp.write(f"--{boundary}\r\n{head}".encode() + data + b"\r\n")
        await resp.write(f"--{boundary}--\r\n".encode())
        await resp.write_eof()
        return resp

    def _info(self, path: Path, name: str, inside: str) -> dict[str, Any]:
        st = path.lstat()
        modified = datetime.fromtimestamp(st.st_mtime, UTC).isoformat()
        return {"name": name, "path": inside, "isDir": path.is_dir() and not path.is_symlink(), "size": st.st_size,
                "mode": oct(st.st_mode), "modTime": modified, "modifiedAt": modified, "owner": "daytona",
                "group": "daytona", "permissions": oct(st.st_mode & 0o777)[2:]}  # fmt: skip

    async def list_files(self, request: web.Request) -> web.Response:
        box = self._box(request)
        inside = request.query.get("path") or HOME
        folder = self._host_path(box, inside)
        if not folder.is_dir():
            return _error(404, f"{inside}: no such folder", code="FILE_NOT_FOUND")
        rows = [self._info(e, e.name, f"{inside.rstrip('/')}/{e.name}") for e in sorted(folder.iterdir())]
        return web.json_response(rows)

    async def file_info(self, request: web.Request) -> web.Response:
        box = self._box(request)
        inside = request.query["path"]
        host = self._host_path(box, inside)
        if not host.exists() and not host.is_symlink():
            return _error(404, f"{inside}: no such file", code="FILE_NOT_FOUND")
        return web.json_response(self._info(host, host.name, inside))

    async def delete_file(self, request: web.Request) -> web.Response:
        box = self._box(request)
        host = self._host_path(box, request.query["path"])
        if not host.exists() and not host.is_symlink():
            return _error(404, "no such file", code="FILE_NOT_FOUND")
        if host.is_dir() and not host.is_symlink():
            if request.query.get("recursive") == "true":
                shutil.rmtree(host)
            else:
                try:
                    host.rmdir()
                except OSError:
                    return _error(400, "directory not empty")
        else:
            host.unlink()
        return web.Response(status=204)

    async def create_folder(self, request: web.Request) -> web.Response:
        box = self._box(request)
        self._host_path(box, request.query["path"]).mkdir(parents=True, exist_ok=True)
        return web.Response(status=201)

    async def work_dir(self, request: web.Request) -> web.Response:
        self._box(request)
        return web.json_response({"dir": HOME})


class DoubleThread:
    """The double on its own event loop in a daemon thread (for tests whose loop comes and goes)."""

    def __init__(self, data_dir: Path, api_key: str = "test-key") -> None:
        self.double = DaytonaDouble(data_dir, api_key)
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="daytona-double", daemon=True)

    def __enter__(self) -> DaytonaDouble:
        self._thread.start()
        asyncio.run_coroutine_threadsafe(self.double.start(), self.loop).result(30)
        return self.double

    def __exit__(self, *exc: object) -> None:
        asyncio.run_coroutine_threadsafe(self.double.stop(), self.loop).result(30)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(10)

    def call(self, fn: Any, *args: Any) -> Any:
        """Run ``fn(*args)`` on the double's loop (its state is not thread-safe)."""

        async def run() -> Any:
            return fn(*args)

        return asyncio.run_coroutine_threadsafe(run(), self.loop).result(30)


async def _serve(port: int, api_key: str, data: Path) -> None:
    double = DaytonaDouble(data, api_key)
    await double.start(port)
    print(f"Daytona API double on {double.api_url} (key {api_key!r}); Ctrl-C stops it", flush=True)
    try:
        await asyncio.Event().wait()
    finally:
        await double.stop()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="a loopback double of the Daytona API")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--api-key", default="test-key")
    parser.add_argument("--data", type=Path, default=None, help="where sandboxes and volumes live (default: temp)")
    args = parser.parse_args(argv)
    data = args.data or Path(tempfile.mkdtemp(prefix="daytona-double-"))
    with contextlib.suppress(KeyboardInterrupt):
        asyncio.run(_serve(args.port, args.api_key, data))


if __name__ == "__main__":
    main()
