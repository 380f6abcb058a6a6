"""``fleet-rlm daytona setup|smoke|gc``: register the snapshot, check everything end to end, and
remove what dead processes left behind in Daytona."""

from __future__ import annotations

import argparse
import asyncio
import json
import socket
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from fleet_rlm.errors import Unavailable


def cmd_daytona(args: argparse.Namespace) -> int:
    from fleet_rlm.config import load_settings

    settings = load_settings(sandbox="daytona")
    action = {"setup": _setup, "smoke": _smoke, "gc": _gc}[args.action]
    return asyncio.run(action(settings, args))


async def _setup(settings: Any, args: argparse.Namespace) -> int:
    from fleet_rlm.sandbox import daytona_client as dc

    started = time.monotonic()
    async with dc.client(settings) as daytona:
        name = await dc.ensure_snapshot(daytona, settings, on_logs=lambda line: print(f"  {line}", flush=True))
    print(f"snapshot {name} is active ({time.monotonic() - started:.1f}s); FLEET_SANDBOX=daytona is ready")
    return 0


async def _smoke(settings: Any, args: argparse.Namespace) -> int:
    """Each part in order, timed; the first failure stops with what to do."""
    from fleet_rlm.sandbox import daytona_client as dc
    from fleet_rlm.sandbox.base import SandboxSpec
    from fleet_rlm.sandbox.daytona import DaytonaSandbox

    rows: list[dict[str, Any]] = []

    async def step(name: str, check: Callable[[], Awaitable[str]]) -> bool:
        began = time.monotonic()
        try:
            detail, ok = await check(), True
        except Exception as exc:  # what happened and what to do, in one line
            detail, ok = dc.explain(exc, f"pass the {name} check"), False
        rows.append({"check": name, "ok": ok, "seconds": round(time.monotonic() - began, 3), "detail": detail})
        return ok

    volume = f"smoke-{socket.gethostname()[:20]}".replace(".", "-")
    box = DaytonaSandbox(settings, SandboxSpec(work_dir=Path("."), volumes={volume: Path(volume)}))
    echoed: list[str] = []

    async def echo(text: str) -> str:
        echoed.append(text)
        return text.upper()

    await box.register_functions({"smoke_echo": echo})
    async with dc.client(settings) as daytona:
        checks: list[tuple[str, Callable[[], Awaitable[str]]]] = [
            ("credentials", lambda: _listed(daytona)),
            ("snapshot", lambda: dc.ensure_snapshot(daytona, settings)),
            ("volume", lambda: _volume(daytona, settings, volume)),
            ("sandbox", lambda: _started(box)),
            ("execution", lambda: _executed(box)),
            ("host bridge", lambda: _bridged(box, echoed)),
        ]
        try:
            for name, check in checks:
                if not await step(name, check):
                    break
        finally:
            await box.shutdown()
    _print(rows, args.json)
    if not all(r["ok"] for r in rows):
        failed = next(r for r in rows if not r["ok"])
        raise Unavailable(f"Daytona smoke test failed at {failed['check']}: {failed['detail']}")
    return 0


async def _listed(daytona: Any) -> str:
    from fleet_rlm.sandbox import daytona_client as dc

    volumes = await dc.retrying(lambda: daytona.volume.list(), safe=True)
    return f"the API answered ({len(volumes)} volume(s))"


async def _volume(daytona: Any, settings: Any, name: str) -> str:
    from fleet_rlm.sandbox import daytona_client as dc

    vol = await dc.ensure_volume(daytona, settings, name)
    return f"{vol.name} is ready"


async def _started(box: Any) -> str:
    await box.start()
    return "sandbox created from the snapshot, REPL context open"


async def _executed(box: Any) -> str:
    result = await box.execute("x = 6 * 7\nx")
    if result.data != 42:
        raise RuntimeError(f"6 * 7 came back as {result.value!r} ({result.error})")
    return "6 * 7 == 42 in the sandbox"


async def _bridged(box: Any, echoed: list[str]) -> str:
    result = await box.execute("smoke_echo('ping')")
    if result.data != "PING" or echoed != ["ping"]:
        raise RuntimeError(f"the host call came back as {result.value!r} ({result.error})")
    return "a host function called from sandbox code answered"


def _print(rows: list[dict[str, Any]], as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=2))
        return
    for row in rows:
        mark = "ok  " if row["ok"] else "FAIL"
        print(f"{mark} {row['check']:<12} {row['seconds']:>7.2f}s  {row['detail']}")


async def _gc(settings: Any, args: argparse.Namespace) -> int:
    """Delete fleet-rlm's sandboxes whose owning process is gone (and, with --all, every one of them)."""
    from fleet_rlm.sandbox import daytona_client as dc

    removed, kept = [], []
    async with dc.client(settings) as daytona:
        from daytona import ListSandboxesQuery

        async for box in daytona.list(ListSandboxesQuery(labels={dc.MANAGED: "true"})):
            who = box.labels.get(dc.OWNER, "")
            if args.all or _orphaned(who):
                if not args.dry_run:
                    await dc.retrying(lambda box=box: box.delete(), safe=True)
                removed.append({"id": box.id, "kind": box.labels.get(dc.KIND, "?"), "owner": who})
            else:
                kept.append({"id": box.id, "kind": box.labels.get(dc.KIND, "?"), "owner": who})
    if args.json:
        print(json.dumps({"removed": removed, "kept": kept, "dry_run": args.dry_run}, indent=2))
    else:
        verb = "would remove" if args.dry_run else "removed"
        for row in removed:
            print(f"{verb} {row['kind']} sandbox {row['id']} (owner {row['owner'] or 'unknown'})")
        print(f"{verb} {len(removed)} sandbox(es); kept {len(kept)} still in use")
    return 0


def _orphaned(who: str) -> bool:
    """A sandbox whose owner process on this host is gone; other hosts' are kept (use --all)."""
    import os

    host, _, pid = who.rpartition(":")
    if who == "shared":  # the volume browser: remade on demand, removed with --all only
        return False
    if host != socket.gethostname() or not pid.isdigit():
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False
    return False
