"""``fleet`` / ``fleet-rlm chat``: an interactive session whose REPL keeps its state between
questions, so follow-ups can build on earlier work."""

from __future__ import annotations

import argparse
import asyncio
import signal
import sys
from typing import Any

from fleet_rlm.cli.common import limit_overrides, settings_for
from fleet_rlm.cli.runs import follow_run

HELP = """Ask a question, or:
  /attach PATH     add a file, folder or vol:NAME/PATH to the next question's context
  /paste           paste text (end with a line holding only '.')
  /context         show what is attached
  /mode MODE       progress: compact, verbose or off
  /runs            recent runs        /open RUN_ID   show a run's trace
  /trace           the last run's trace
  /new             start a fresh session (new REPL)
  /help            this help          /quit          leave (Ctrl-D too)"""


class Chat:
    def __init__(self, engine: Any, args: argparse.Namespace) -> None:
        self.engine = engine
        self.args = args
        self.mode = args.trace_mode
        self.paths: list[str] = list(args.context)
        self.texts: list[str] = []
        self.session_id: str | None = None
        self.last_run: str | None = None

    async def ask(self, question: str) -> None:
        from fleet_rlm.core.types import RunRequest

        if self.session_id is None:
            self.session_id = await self.engine.open_session(name="terminal chat")
        req = RunRequest(question=question, context_paths=self.paths, context_text=self.texts,
                         session_id=self.session_id, **limit_overrides(self.args))
        # Ctrl-C during a run cancels that run and returns to the prompt, not out of the chat.
        loop = asyncio.get_running_loop()
        task = asyncio.ensure_future(follow_run(self.engine, req, self.mode))
        loop.add_signal_handler(signal.SIGINT, task.cancel)
        try:
            result = await task
        except asyncio.CancelledError:
            print("cancelled", file=sys.stderr)
            return
        finally:
            loop.remove_signal_handler(signal.SIGINT)
        self.paths, self.texts = [], []  # attached inputs now live in the REPL
        self.last_run = result.run_id
        print(result.answer if result.answer is not None else f"(no answer: {result.error or result.stop_reason})")
        print(f"[{result.status} · {result.iterations} steps · {result.llm_calls} model calls · "
              f"{result.seconds:.1f}s · run {result.run_id}]", file=sys.stderr)

    def show_trace(self, run_id: str | None) -> None:
        from fleet_rlm.cli.trace_view import render
        from fleet_rlm.core.trace import build_trace

        if not run_id:
            print("no run yet")
            return
        row = self.engine.get_run(run_id)
        if row is None:
            print(f"no run '{run_id}'")
            return
        render(row, build_trace(self.engine.events(run_id)))

    async def command(self, line: str) -> bool:
        """Handle a slash command; False means quit."""
        cmd, _, arg = line.partition(" ")
        arg = arg.strip()
        if cmd in {"/quit", "/exit"}:
            return False
        if cmd == "/attach" and arg:
            self.paths.append(arg)
            print(f"attached {arg}")
        elif cmd == "/paste":
            lines = []
            while (text := await asyncio.to_thread(input)) != ".":
                lines.append(text)
            self.texts.append("\n".join(lines))
            print(f"pasted {len(self.texts[-1]):,} characters")
        elif cmd == "/context":
            print("\n".join(self.paths + [f"(pasted, {len(t):,} chars)" for t in self.texts]) or "nothing attached")
        elif cmd == "/mode" and arg in {"compact", "verbose", "off"}:
            self.mode = arg
        elif cmd == "/runs":
            for r in self.engine.list_runs(limit=10):
                print(f"{r.id}  {r.status:<11} {r.question[:70]}")
        elif cmd == "/open":
            self.show_trace(arg)
        elif cmd == "/trace":
            self.show_trace(self.last_run)
        elif cmd == "/new":
            if self.session_id:
                await self.engine.close_session(self.session_id)
            self.session_id = None
            print("new session")
        else:
            print(HELP)
        return True

    async def loop(self) -> None:
        print("fleet-rlm chat: ask about your files. /help for commands, /quit to leave.", file=sys.stderr)
        while True:
            try:
                line = (await asyncio.to_thread(input, "> ")).strip()
            except EOFError:
                return
            if not line:
                continue
            if line.startswith("/"):
                if not await self.command(line):
                    return
                continue
            try:
                await self.ask(line)
            except Exception as exc:  # keep the session alive after a bad question
                print(f"error: {exc}", file=sys.stderr)


def cmd_chat(args: argparse.Namespace) -> int:
    from fleet_rlm.core.engine import Engine

    settings = settings_for(args)

    async def go() -> None:
        async with Engine(settings) as engine:
            await Chat(engine, args).loop()

    asyncio.run(go())
    return 0
