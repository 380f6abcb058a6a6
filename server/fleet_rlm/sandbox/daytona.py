"""The Daytona sandbox backend: the same REPL contract as ``local``, run in Daytona sandboxes.

A ``DaytonaSandbox`` is one Daytona interpreter context (its own Python process) running
``daytona_shim.Shim``, a ``worker.Worker`` speaking over the context's streamed stdout. Each
request is one ``run_code``; see ``daytona_shim`` for the frames and the in-band host-call bridge
(a ``call`` frame out, an uploaded reply file back; no key, port or broker in the sandbox).

Where the context lives: a Daytona sandbox created from fleet-rlm's snapshot (network blocked
unless ``FLEET_DAYTONA_NETWORK=allow``, ownership labels, the run's volumes mounted at
``/home/daytona/volumes/<name>``), or, for a child RLM with ``FLEET_DAYTONA_CHILDREN=shared``, a
second context in its parent's sandbox. At most ``FLEET_DAYTONA_MAX_SANDBOXES`` are held at once.

Faults: 429 waits for ``Retry-After``; a refused upgrade or 502/503 before the code was sent is
retried; once the code was sent, a broken connection makes the step's outcome unknown and it is
never run again (``error_kind="unknown"``). A context lost to a timeout kill or a stopped sandbox
is recreated (the sandbox started, not recovered) and the next output tells the model its
variables are gone. Everything the sandbox sends is hostile: frames are size-bounded,
depth-checked and matched against the request in flight; anything else fails the sandbox.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fleet_rlm.redaction import redact_text
from fleet_rlm.sandbox import daytona_client as dc
from fleet_rlm.sandbox.base import (
    Backend,
    ExecResult,
    HostCallBudget,
    HostFunction,
    ProtocolViolation,
    SandboxError,
    SandboxSpec,
    answer_host_call,
    exec_result,
    input_file_path,
    register_backend,
)
from fleet_rlm.sandbox.daytona_frames import Frames

log = logging.getLogger(__name__)

REPLY_END = b"\n\x04"  # keep in step with daytona_shim.REPLY_END
GRACE = 15  # seconds Daytona's own timeout waits past the shim's, for code stuck in C
CREATE_TIMEOUT = 180.0
AUTO_DELETE_MINUTES = 60  # a stopped, forgotten sandbox is deleted by Daytona after this


class _Remote:
    """One Daytona sandbox and the contexts (fleet sandboxes) using it."""

    def __init__(self, sandbox: Any, owned: bool) -> None:
        self.sandbox = sandbox
        self.owned = owned  # created by us: deleted when its last user shuts down
        self.users = 0
        self.restarted = 0  # times it was found stopped and started again
        self.keepalive: asyncio.Task[None] | None = None
        self.lock = asyncio.Lock()


_slots: dict[asyncio.AbstractEventLoop, asyncio.Semaphore] = {}


def _slot(settings: Any) -> asyncio.Semaphore:
    loop = asyncio.get_running_loop()
    if loop not in _slots:
        _slots[loop] = asyncio.Semaphore(settings.daytona_max_sandboxes)
    return _slots[loop]


class _Unknown(Exception):
    """The code was sent and the connection broke: whether it ran is unknown."""


class _Lost(Exception):
    """The interpreter context (and its variables) is gone; ``ran``: the request may have run."""

    def __init__(self, why: str, *, ran: bool = True) -> None:
        super().__init__(why)
        self.ran = ran


class DaytonaSandbox:
    """A persistent REPL in a Daytona interpreter context, driven from asyncio."""

    isolation = "daytona"

    def __init__(self, settings: Any, spec: SandboxSpec) -> None:
        self.settings = settings
        self.spec = spec
        for name in spec.volumes:
            if not name or "/" in name or name in (".", ".."):
                raise ValueError(f"invalid volume name {name!r}")
        self.volume_paths = {name: f"{dc.VOLUME_ROOT}/{name}" for name in spec.volumes}
        self.output_limit = spec.output_limit
        self._host_bytes = HostCallBudget(spec.host_call_mb, spec.host_call_total_mb)  # the frames' calls
        near = spec.near if settings.daytona_children == "shared" else None
        self._near: DaytonaSandbox | None = near if isinstance(near, DaytonaSandbox) else None
        self._remote: _Remote | None = None
        self._client: Any = None
        self._ctx: Any = None
        self._folder = f"/tmp/fleet-{uuid.uuid4().hex[:12]}"  # this context's reply folder
        self._functions: dict[str, HostFunction] = {}
        self._output_fields: list[dict[str, Any]] | None = None
        self._inputs: dict[str, tuple[str, Any]] = {}  # name -> ("var"|"text", value): re-bound after a loss
        self._notices: list[str] = []  # told to the model with the next step's output
        self._ids = itertools.count(1)
        self._lock = asyncio.Lock()
        self._start_lock = asyncio.Lock()
        self._tasks: set[asyncio.Task[Any]] = set()
        self._failure: str | None = None
        self._closed = False
        self._recreating = False
        self._owner = False  # this context's Daytona sandbox was created for it (and is billed to it)

    # -- protocol surface -----------------------------------------------------------------------

    @property
    def warnings(self) -> list[str]:
        if self.settings.daytona_network == "allow":
            return ["Daytona sandbox network egress is ALLOWED (FLEET_DAYTONA_NETWORK=allow): code can reach the "
                    "internet; unset it to block egress again"]  # fmt: skip
        return []

    @property
    def alive(self) -> bool:
        return self._ctx is not None and not self._closed and self._failure is None

    @property
    def cost_per_second(self) -> float:
        """What this sandbox costs while held; a context in a parent's sandbox adds nothing."""
        return self.settings.daytona_cost_per_hour / 3600 if self._owner else 0.0

    async def start(self) -> None:
        async with self._start_lock:
            self._check()
            if self._ctx is not None:
                return
            try:
                self._client = await dc.acquire_client(self.settings)
                self._remote = await self._attach()
                await self._open_context()
            except SandboxError:
                raise
            except Exception as exc:
                raise SandboxError(dc.explain(exc, "start a sandbox")) from None

    async def execute(
        self, code: str, *, timeout: float | None = None, on_output: Callable[[str], None] | None = None
    ) -> ExecResult:
        await self.start()
        limit = timeout if timeout is not None else self.spec.exec_timeout
        message = {"op": "execute", "code": code, "timeout": limit, "output_limit": self.output_limit}
        started = time.monotonic()
        try:
            reply = await self._request(message, limit=limit, on_output=on_output, repeatable=False)
            result = exec_result(reply, self.output_limit)
        except ProtocolViolation as exc:
            raise await self._fail(f"the sandbox broke the protocol ({exc}), so it was stopped") from None
        except _Unknown as exc:
            result = self._failed_step("unknown", started, (
                f"ConnectionError: the connection to the Daytona sandbox broke while this step ran ({exc}), so "
                "whether it ran, fully or partly, is unknown. It was NOT run again. Check the variables it "
                "would have set before relying on them."
            ))  # fmt: skip
        except _Lost as exc:
            result = self._failed_step("exception", started, (
                f"SandboxStateLost: this step did not finish ({exc}). The REPL was recreated: variables from "
                "earlier steps are gone (query, context and sources were bound again)."
            ))  # fmt: skip
        except TimeoutError:
            result = self._failed_step("timeout", started, (
                f"TimeoutError: the code ran past the {limit:g} s limit and did not stop when interrupted, so "
                "Daytona ended it. Split the work into smaller steps."
            ))  # fmt: skip
        if self._notices:
            result.stdout = "".join(f"[sandbox] {n}\n" for n in self._notices) + result.stdout
            self._notices.clear()
        return result

    @staticmethod
    def _failed_step(kind: str, started: float, error: str) -> ExecResult:
        return ExecResult("", None, error, kind, None, time.monotonic() - started)  # type: ignore[arg-type]

    async def set_var(self, name: str, value: Any) -> None:
        await self.start()
        self._inputs[name] = ("var", value)
        await self._request({"op": "set_var", "name": name, "value": value})

    async def put_text(self, name: str, data: str | Path) -> None:
        """Bind text as a global; the bytes are uploaded (a Path is a host-owned file, streamed)."""
        await self.start()
        self._inputs[name] = ("text", data)
        await self._request({"op": "put_text", "name": name}, upload=data)

    async def append_var(self, name: str, value: Any) -> None:
        await self.start()
        _, current = self._inputs.get(name, ("var", []))
        self._inputs[name] = ("var", [*(current if isinstance(current, list) else []), value])  # re-bound whole
        await self._request({"op": "append_var", "name": name, "value": value})

    async def put_file(self, path: str, data: Path) -> None:
        """Write a host-owned file into the work folder: uploaded, then moved into place by the shim."""
        await self.start()
        await self._request({"op": "put_file", "path": input_file_path(path)}, upload=Path(data))

    async def register_functions(self, fns: dict[str, HostFunction]) -> None:
        self._functions.update(fns)
        if self._ctx is not None and fns:
            await self._request({"op": "define_functions", "names": list(fns)})

    async def configure_output_fields(self, fields: list[dict[str, Any]]) -> None:
        self._output_fields = [dict(f) for f in fields]
        if self._ctx is not None:
            await self._request({"op": "configure", "output_fields": self._output_fields})

    async def shutdown(self) -> None:
        """Delete the context (and the sandbox, when this was its last user); safe to repeat."""
        if self._closed:
            return
        self._closed = True
        self._failure = self._failure or "the sandbox was shut down; create a new one"
        for task in list(self._tasks):
            task.cancel()
        remote, self._remote = self._remote, None
        if remote is not None:
            remote.users -= 1
            with contextlib.suppress(Exception):
                if self._ctx is not None and remote.users > 0:
                    await remote.sandbox.code_interpreter.delete_context(self._ctx)
            if remote.users <= 0:
                await self._retire(remote)
        self._ctx = None
        if self._client is not None:
            self._client = None
            await dc.release_client()

    # -- the Daytona sandbox under the context --------------------------------------------------

    async def _attach(self) -> _Remote:
        near = self._near
        if near is not None and near._remote is not None and near.alive:
            near._remote.users += 1
            return near._remote
        await _slot(self.settings).acquire()
        try:
            remote = _Remote(await self._create(), owned=True)
        except BaseException:
            _slot(self.settings).release()
            raise
        remote.users = 1
        self._owner = True
        remote.keepalive = asyncio.create_task(self._keepalive(remote))
        return remote

    async def _create(self) -> Any:
        from daytona import CreateSandboxFromSnapshotParams, FileUpload, ListSandboxesQuery, VolumeMount

        client, settings = self._client, self.settings
        snapshot = await dc.ensure_snapshot(client, settings)
        mounts = []
        for name in self.spec.volumes:  # one Daytona volume per fleet volume, ready before it is mounted
            volume = await dc.ensure_volume(client, settings, name)
            mounts.append(VolumeMount(volume_id=volume.id, mount_path=self.volume_paths[name]))
        token = uuid.uuid4().hex
        params = CreateSandboxFromSnapshotParams(
            snapshot=snapshot,
            language="python",
            labels=dc.labels("repl", **{dc.CREATE_TOKEN: token}),
            env_vars={},  # nothing of the host's environment, keys least of all
            network_block_all=settings.daytona_network == "block",
            auto_stop_interval=settings.daytona_auto_stop_minutes,
            auto_delete_interval=AUTO_DELETE_MINUTES,
            volumes=mounts,
        )

        async def create() -> Any:
            try:
                return await client.create(params, timeout=CREATE_TIMEOUT)
            except Exception as exc:
                if dc.status_of(exc) == 429 or not dc.transient(exc):
                    raise
                # The answer was lost, not necessarily the sandbox: adopt it if it was made.
                async for found in client.list(ListSandboxesQuery(labels={dc.CREATE_TOKEN: token})):
                    await found.wait_for_sandbox_start(timeout=CREATE_TIMEOUT)
                    return found
                raise

        sandbox = await dc.retrying(create, safe=True)
        files = [FileUpload(data, f"{dc.FLEET_DIR}/{name}") for name, data in dc.worker_sources().items()]
        await dc.retrying(lambda: sandbox.fs.upload_files(files), safe=True)
        return sandbox

    async def _keepalive(self, remote: _Remote) -> None:
        """Reset Daytona's auto-stop timer while this process holds the sandbox (an open session
        keeps its REPL); if this process dies, auto-stop and auto-delete clean up after it."""
        period = max(30.0, self.settings.daytona_auto_stop_minutes * 60 / 3)
        while True:
            await asyncio.sleep(period)
            with contextlib.suppress(Exception):
                await remote.sandbox.refresh_activity()

    async def _retire(self, remote: _Remote) -> None:
        if remote.keepalive is not None:
            remote.keepalive.cancel()
        if remote.owned:
            with contextlib.suppress(Exception):
                await dc.retrying(lambda: remote.sandbox.delete(), safe=True)
            _slot(self.settings).release()

    async def _revive(self, remote: _Remote) -> bool:
        """Start the sandbox if Daytona stopped it (auto-stop); True if it had to be started."""
        from daytona import DaytonaNotFoundError

        async with remote.lock:
            try:
                await dc.retrying(lambda: remote.sandbox.refresh_data(), safe=True)
            except DaytonaNotFoundError:
                raise SandboxError("the Daytona sandbox was deleted (by `fleet-rlm daytona gc`, auto-delete or "
                                   "by hand); the next run gets a new one") from None  # fmt: skip
            state = str(getattr(remote.sandbox.state, "value", remote.sandbox.state))
            if state == "started":
                return False
            if state in ("stopped", "archived", "stopping"):
                if state == "stopping":
                    await remote.sandbox.wait_for_sandbox_stop(timeout=CREATE_TIMEOUT)
                await dc.retrying(lambda: remote.sandbox.start(timeout=CREATE_TIMEOUT), safe=True)
                remote.restarted += 1
                return True
            raise SandboxError(f"the Daytona sandbox is {state} ({remote.sandbox.error_reason or 'no reason given'})"
                               "; the next run gets a new one")  # fmt: skip

    # -- the interpreter context ----------------------------------------------------------------

    async def _open_context(self) -> None:
        assert self._remote is not None
        sandbox = self._remote.sandbox
        self._ctx = await dc.retrying(lambda: sandbox.code_interpreter.create_context(cwd=dc.HOME), safe=True)
        boot = (
            f"import sys\nsys.path.insert(0, {dc.FLEET_DIR!r})\nimport fleet_shim\n"
            f"__fleet = fleet_shim.Shim({self._folder!r}, {int(self.spec.memory_mb)})\n"
        )
        result = await dc.retrying(lambda: sandbox.code_interpreter.run_code(boot, context=self._ctx, timeout=60),
                                   safe=True)  # fmt: skip
        if result.error is not None:
            name, value = str(result.error.name)[:100], redact_text(str(result.error.value))[:500]
            raise SandboxError(f"the sandbox REPL did not start ({name}: {value}); the snapshot may be broken: "
                               "run `fleet-rlm daytona setup`")  # fmt: skip
        if self._functions:
            await self._exchange({"op": "define_functions", "names": list(self._functions)})
        if self._output_fields is not None:
            await self._exchange({"op": "configure", "output_fields": self._output_fields})

    async def _recreate(self, why: str) -> None:
        """A new context after the old one (and its variables) died; inputs are bound again."""
        assert self._remote is not None
        old, self._ctx = self._ctx, None
        with contextlib.suppress(Exception):
            if old is not None:
                await self._remote.sandbox.code_interpreter.delete_context(old)
        self._recreating = True
        try:
            await self._open_context()
            for name, (kind, value) in list(self._inputs.items()):
                if kind == "var":
                    await self._exchange({"op": "set_var", "name": name, "value": value})
                elif isinstance(value, str) or Path(value).is_file():  # a staged file lives as long as its run
                    await self._exchange({"op": "put_text", "name": name}, upload=value)
        finally:
            self._recreating = False
        self._notices.append(f"{why}: the REPL was recreated and variables from earlier steps are gone "
                             "(query, context and sources were bound again)")  # fmt: skip

    async def _context_alive(self) -> bool:
        assert self._remote is not None
        contexts = await dc.retrying(lambda: self._remote.sandbox.code_interpreter.list_contexts(), safe=True)  # type: ignore[union-attr]
        return any(c.id == self._ctx.id for c in contexts)

    # -- requests ---------------------------------------------------------------------------------

    def _check(self) -> None:
        if self._failure is not None:
            raise SandboxError(self._failure)

    async def _fail(self, reason: str) -> SandboxError:
        self._failure = reason
        log.warning("daytona sandbox failed: %s", reason)
        await self.shutdown()
        self._failure = reason
        return SandboxError(reason)

    async def _request(
        self,
        message: dict[str, Any],
        *,
        limit: float | None = None,
        on_output: Callable[[str], None] | None = None,
        upload: str | Path | None = None,
        repeatable: bool = True,
    ) -> dict[str, Any]:
        async with self._lock:
            self._check()
            return await self._exchange(message, limit, on_output, upload, repeatable)

    async def _exchange(
        self,
        message: dict[str, Any],
        limit: float | None = None,
        on_output: Callable[[str], None] | None = None,
        upload: str | Path | None = None,
        repeatable: bool = True,
    ) -> dict[str, Any]:
        """One request and its checked reply (callers hold ``_lock``). A ``repeatable`` request is
        idempotent and sent again after a broken connection; an ``execute`` is not: ``_Unknown``."""
        for attempt in range(dc.MAX_ATTEMPTS):
            try:
                reply = await self._send(message, limit, on_output, upload)
            except _Unknown:
                if not repeatable or attempt == dc.MAX_ATTEMPTS - 1:
                    raise
                await asyncio.sleep(dc.backoff(attempt, Exception()))
                continue
            except _Lost as exc:
                if self._recreating:
                    raise SandboxError(f"the Daytona sandbox keeps losing its REPL ({exc}); try again later") from None
                await self._recreate(str(exc))
                if exc.ran and not repeatable:
                    raise
                continue
            if reply["op"] == "error":
                raise ValueError(f"sandbox rejected {message['op']}: {str(reply.get('error'))[:2000]}")
            return reply
        raise SandboxError(f"the Daytona sandbox did not answer a {message['op']} request after several tries")

    async def _send(
        self,
        message: dict[str, Any],
        limit: float | None,
        on_output: Callable[[str], None] | None,
        upload: str | Path | None,
    ) -> dict[str, Any]:
        """Send once (again only while nothing can have run); the reply frame, or why there is none."""
        from daytona import DaytonaError, DaytonaTimeoutError

        assert self._remote is not None
        remote = self._remote
        message = {**message, "id": next(self._ids)}
        code = f"__fleet.cell({json.dumps(message, ensure_ascii=False, default=str)!r})"
        timeout = 0 if not limit else int(limit) + GRACE
        for attempt in range(dc.MAX_ATTEMPTS):
            frames, running = Frames(self, message, on_output), False
            try:
                if upload is not None:
                    source = upload.encode("utf-8", "surrogatepass") if isinstance(upload, str) else str(upload)
                    await remote.sandbox.fs.upload_file(source, f"{self._folder}/input")
                running = True
                result = await remote.sandbox.code_interpreter.run_code(
                    code, context=self._ctx, on_stdout=frames.feed, on_stderr=frames.stderr, timeout=timeout
                )
                break
            except DaytonaTimeoutError:
                if await self._context_alive():
                    raise TimeoutError from None
                raise _Lost("Daytona stopped a step that ran past its time limit") from None
            except DaytonaError as exc:
                if frames.violation is not None:
                    raise frames.violation from None
                if running and (frames.started or not dc.not_sent(exc)):
                    raise await self._classify(exc) from None  # the code may have run: never again
                if attempt == dc.MAX_ATTEMPTS - 1 or not (dc.status_of(exc) == 429 or dc.transient(exc)):
                    if dc.status_of(exc) in (400, 404, 502) and await self._revive(remote):
                        raise _Lost(
                            "Daytona had stopped the sandbox (auto-stop); it was started again", ran=False
                        ) from None
                    raise SandboxError(dc.explain(exc, "reach the sandbox")) from None
                if dc.status_of(exc) in (502, 503) and await self._revive(remote):
                    raise _Lost(
                        "Daytona had stopped the sandbox (auto-stop); it was started again", ran=False
                    ) from None
                await asyncio.sleep(dc.backoff(attempt, exc))
        await frames.settle()
        if frames.reply is None:
            if result.error is not None or not await self._context_alive():
                raise _Lost("the sandbox's Python process ended")
            raise ProtocolViolation("a request ended without its reply")
        return frames.reply

    async def _classify(self, exc: BaseException) -> Exception:
        """The code was sent and the connection broke: a stopped sandbox lost the context, else unknown."""
        with contextlib.suppress(SandboxError):
            assert self._remote is not None
            if await self._revive(self._remote):
                return _Lost("Daytona had stopped the sandbox while the step ran; it was started again")
        with contextlib.suppress(Exception):
            if not await self._context_alive():
                return _Lost("the sandbox's Python process ended")
        return _Unknown(redact_text(str(exc))[:300])

    # -- host calls ---------------------------------------------------------------------------------

    def start_host_call(
        self, call_id: int, name: str, args: list[Any], kwargs: dict[str, Any], size: int, calls: set[int]
    ) -> None:
        """Answer one host call the REPL made (``Frames`` read it) in the background: refused at once
        when its bytes would pass the host-call budget, otherwise added to ``calls`` until answered."""
        refusal = self._host_bytes.take(size, name)
        if refusal is not None:
            self._spawn(self._reply(call_id, {"ok": False, "error": f"RuntimeError: {refusal}"}))
            return
        calls.add(call_id)
        self._host_bytes.give_when_done(self._spawn(self._answer(call_id, name, args, kwargs, calls)), size)

    async def settle_replies(self, timeout: float) -> None:
        """Wait (up to ``timeout``) for replies still being uploaded."""
        pending = [t for t in self._tasks if not t.done()]
        if pending:
            await asyncio.wait(pending, timeout=timeout)

    def _spawn(self, coro: Any) -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def _answer(self, call_id: int, name: str, args: list[Any], kwargs: dict[str, Any], calls: set[int]) -> None:
        try:
            answer = await answer_host_call(self._functions, name, args, kwargs)
        finally:
            calls.discard(call_id)
        await self._reply(call_id, answer)

    async def _reply(self, call_id: int, answer: dict[str, Any]) -> None:
        data = json.dumps(answer, ensure_ascii=False, default=str).encode("utf-8", "surrogatepass") + REPLY_END
        assert self._remote is not None
        sandbox = self._remote.sandbox
        with contextlib.suppress(Exception):  # a lost reply ends as the step's timeout, never a host crash
            await dc.retrying(lambda: sandbox.fs.upload_file(data, f"{self._folder}/{call_id}.reply"), safe=True)


def _daytona_sandbox(settings: Any, spec: SandboxSpec) -> DaytonaSandbox:
    return DaytonaSandbox(settings, spec)


def _daytona_doctor(settings: Any) -> dict[str, dict[str, Any]]:
    from fleet_rlm.sandbox.daytona_doctor import doctor

    return doctor(settings)


register_backend(
    Backend(
        "daytona",
        _daytona_sandbox,
        _daytona_doctor,
        "Daytona sandboxes (remote, isolated), Daytona volumes",
        check=dc.config,
    )
)
