"""``run``, ``runs``, ``trace`` and ``export``."""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import sys
import time
from pathlib import Path
from typing import Any

from fleet_rlm.cli.common import limit_overrides, open_workspace, plural, print_json, settings_for, status_exit
from fleet_rlm.types import tokens_of

URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")  # a --context value that names a scheme is a URL, not a path


async def follow_run(engine: Any, req: Any, mode: str) -> Any:
    """Start a run, show its progress until it finishes; Ctrl-C cancels it (recorded as cancelled)."""
    return await follow_started(engine, await engine.start_run(req), mode)


async def follow_started(engine: Any, run_id: str, mode: str) -> Any:
    """Show a started run's progress until it finishes; Ctrl-C cancels it (recorded as cancelled)."""
    from fleet_rlm.cli.progress import Progress  # rich: only a run shows progress, `runs` and `export` don't

    await Progress(mode).follow(engine, run_id)
    return await engine.wait(run_id)


def read_stdin_contexts(paths: list[str]) -> tuple[list[str], list[str]]:
    """``-`` among the context paths means stdin, read as pasted text."""
    if "-" not in paths:
        return paths, []
    if sys.stdin.isatty():  # otherwise the command seems to hang
        print(
            "reading the context from the terminal: type or paste it, then Ctrl-D on a line of its own", file=sys.stderr
        )
    return [p for p in paths if p != "-"], [sys.stdin.read()]


def cmd_run(args: argparse.Namespace) -> int:
    from fleet_rlm.core.warmup import start_warm_up

    settings = settings_for(args)
    start_warm_up(settings)  # the sandbox's checks wait on other processes while dspy imports below
    from fleet_rlm.core.admission import admit
    from fleet_rlm.types import RunRequest, split_repo
    from fleet_rlm.volumes import volumes_for

    urls = [
        c for c in args.context if URL.match(c)
    ]  # fetched (http and https only: RunRequest says so); the rest: paths
    paths, stdin_texts = read_stdin_contexts([c for c in args.context if c not in urls])
    repo_url, repo_ref = split_repo(args.repo) if args.repo else (None, None)
    req = RunRequest(
        question=args.question,
        context_paths=paths,
        context_text=stdin_texts + args.text,
        context_urls=urls,
        repo_url=repo_url,
        repo_ref=repo_ref,
        session_id=args.session,
        volume=args.volume,
        include_hidden=args.include_hidden,
        mcp_servers=args.mcp,
        tools=args.tool,
        allow_tools=args.allow_tool,
        **limit_overrides(args),
    )
    admit(settings, req, lambda: volumes_for(settings))  # a mistake is refused before the runtime loads
    from fleet_rlm.core.engine import Engine
    from fleet_rlm.core.views import cache_note, models_note

    async def go() -> Any:
        async with Engine(settings) as engine:
            return await follow_run(engine, req, "off" if args.trace_mode == "off" else args.trace_mode)

    result = asyncio.run(go())
    if args.json:
        print_json(result.to_dict())
    else:
        if result.answer is not None:
            print(result.answer)
        tokens = result.usage.get("total") or {}
        print(
            f"[{result.status} · run {result.run_id} · {plural(result.iterations, 'step')}"
            f" · {plural(result.llm_calls, 'model call')}"
            f" · {tokens_of(tokens):,} tokens"
            f"{cache_note(tokens)}{models_note(result.usage)} · {result.seconds:.1f}s]"
            + (f"\n{result.stop_reason}" if result.stop_reason else ""),
            file=sys.stderr,
        )
        if result.error:
            print(f"error: {result.error}", file=sys.stderr)
    return status_exit(result.status)


def cmd_runs(args: argparse.Namespace) -> int:
    from fleet_rlm.core.views import lineage_line, lineage_of, run_summary

    with open_workspace(secrets=False) as ws:
        rows = ws.runs(limit=args.limit, status=args.status)
    if args.json:
        print_json([run_summary(r).model_dump(mode="json") for r in rows])
        return 0
    if not rows and args.status:
        print(f"no {args.status} runs: `fleet-rlm runs` lists them all")
    elif not rows:
        print('no runs yet: try `fleet-rlm run "question" --context FILE`')
    for r in rows:
        when = time.strftime("%Y-%m-%d %H:%M", time.localtime(r.created_at))
        lineage = lineage_line(**lineage_of(r))
        notes = ", ".join(n for n in (lineage, "pinned" if r.pinned else None) if n)
        print(f"{r.id}  {when}  {r.status:<11} {r.question[:70]}" + (f"  ({notes})" if notes else ""))
    if rows:  # on stderr: the table stays clean for pipes
        print("refer to a run by its id, a unique part of it (the end is enough), or last / last~N", file=sys.stderr)
    return 0


def cmd_pin(args: argparse.Namespace) -> int:
    from fleet_rlm.core import operations

    with open_workspace(secrets=False) as ws:
        run = operations.pin_run(ws, args.run_id, pinned=not args.off)
    print(f"run {run.run_id} {'pinned: retention keeps it' if run.pinned else 'unpinned: retention may delete it'}")
    return 0


def _load_trace(run_id: str, *, secrets: bool = False) -> tuple[Any, list[dict[str, Any]]]:
    with open_workspace(secrets=secrets) as ws:
        row = ws.run(run_id)
        return row, ws.events(row.id)


def cmd_trace(args: argparse.Namespace) -> int:
    from fleet_rlm.core.trace import build_trace

    row, events = _load_trace(args.run_id)
    trace = build_trace(events)
    if args.json:
        print_json(trace)
        return 0
    from fleet_rlm.cli.trace_view import render

    render(row, trace, full=args.full)
    return 0


def cmd_export(args: argparse.Namespace) -> int:
    if args.html:
        return _export_html(args.run_id, Path(args.html), args.force)
    if args.format == "rlms":
        from fleet_rlm.core.export_rlms import rlms_rows

        for row in rlms_rows(_load_trace(args.run_id, secrets=True)[1]):
            print(json.dumps(row, ensure_ascii=False))  # one line each: the rlms visualizer reads JSON lines
        return 0
    with open_workspace(secrets=False) as ws:
        for event in ws.export(args.run_id):
            print_json(event)
    return 0


def _export_html(run_id: str, target: Path, force: bool) -> int:
    from fleet_rlm.core.html_export import BLOCK_CAP, run_html
    from fleet_rlm.errors import UserError

    if target.exists() and not force:  # it may be anything, e.g. an earlier export someone annotated
        raise UserError(f"{target} exists: choose another file, or pass --force to overwrite it")
    row, events = _load_trace(run_id, secrets=True)
    page = run_html(row.id, events)
    target.write_text(page.html, encoding="utf-8")
    print(f"wrote {target} ({page.size:,} bytes)", file=sys.stderr)
    if page.cut:
        blocks = plural(len(page.cut), "long block")
        print(
            f"{blocks} of code or output cut to their first and last {BLOCK_CAP // 2:,} characters (the file lists"
            f" them); `fleet-rlm export {row.id}` has every event in full",
            file=sys.stderr,
        )
    return 0
