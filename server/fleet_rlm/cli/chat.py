"""``fleet`` / ``fleet-rlm chat``: an interactive session whose REPL keeps its state between
questions, so follow-ups can build on earlier work.

Lines are read by a helper thread (``LineReader``) so that Ctrl-C can stop waiting without
killing the chat: at the prompt it asks for a second Ctrl-C (or ``/quit``), during a run it
cancels that run. An attachment is checked when it is attached and refused at once if it
cannot be used, so one bad path never spoils the questions after it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import signal
import sys
import threading
from collections.abc import Awaitable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from fleet_rlm.cli.common import fail, limit_overrides, settings_for
from fleet_rlm.cli.runs import follow_started
from fleet_rlm.errors import RunNotFound, UserError

T = TypeVar("T")
PASTE_END = "."
HELP = f"""Ask a question, or:
  /attach PATH...   add files, folders or vol:NAME/PATH to the next question (quote paths with spaces)
  /detach [N]       remove attachment N (see /context), or all of them
  /paste            paste text; end with a line holding only '{PASTE_END}' (or Ctrl-D)
  /context          list what is attached
  /mode MODE        progress: compact, verbose or off
  /runs             recent runs        /open RUN_ID   show a run's trace
  /trace            the last run's trace
  /new              start a fresh session (new REPL, no attachments)
  /help             this help          /quit          leave (Ctrl-D, or Ctrl-C twice)"""


class Interrupted(Exception):
    """Ctrl-C stopped what the chat was waiting for."""


class LineReader:
    """Lines from stdin, read by a helper thread: a wait that Ctrl-C cancels leaves the read
    running, and the next ``read`` picks up the line it brings."""

    def __init__(self) -> None:
        self._pending: asyncio.Future[str | None] | None = None

    async def read(self, prompt: str = "") -> str | None:
        """The next line, or None at the end of input (Ctrl-D)."""
        if self._pending is None:
            loop = asyncio.get_running_loop()
            future: asyncio.Future[str | None] = loop.create_future()
            threading.Thread(target=self._read, args=(loop, future, prompt), daemon=True).start()
            self._pending = future
        line = await asyncio.shield(self._pending)
        self._pending = None
        return line

    @staticmethod
    def _read(loop: asyncio.AbstractEventLoop, future: asyncio.Future[str | None], prompt: str) -> None:
        try:
            line: str | None = input(prompt)
        except (EOFError, OSError, ValueError):  # end of input, or stdin closed under us
            line = None
        with contextlib.suppress(RuntimeError):  # the chat already ended
            loop.call_soon_threadsafe(lambda: future.done() or future.set_result(line))


@dataclass
class Attachment:
    path: str | None = None  # a host path or vol:NAME/PATH
    text: str | None = None  # pasted text

    def label(self) -> str:
        return self.path if self.path is not None else f"(pasted, {len(self.text or ''):,} chars)"


class Chat:
    banner = "fleet-rlm chat: ask about your files. /help for commands, /quit to leave."  # printed at start
    help = HELP  # what /help prints

    def __init__(self, engine: Any, args: argparse.Namespace, reader: LineReader | None = None) -> None:
        self.engine = engine
        self.args = args
        self.mode = args.trace_mode
        self.reader = reader or LineReader()
        self.attached: list[Attachment] = []
        self.session_id: str | None = None
        self.last_run: str | None = None
        self._waiting: asyncio.Task[Any] | None = None  # what Ctrl-C interrupts
        self._sigint = False  # a Ctrl-C is being delivered to ``_waiting``
        self._twice = False  # ... and another came before it was handled

    # -- Ctrl-C ---------------------------------------------------------------------------------

    def on_sigint(self) -> None:
        if self._waiting is not None and not self._waiting.done():
            self._twice = self._sigint
            self._sigint = True
            self._waiting.cancel()

    async def interruptible(self, work: Awaitable[T]) -> T:
        """Await ``work``; Ctrl-C cancels it and raises ``Interrupted``."""
        self._twice = False
        task = asyncio.ensure_future(work)
        self._waiting = task
        try:
            return await task
        except asyncio.CancelledError:
            if not self._sigint:  # the chat itself is being shut down
                raise
            self._sigint = False  # ``_twice`` stays for the caller to read
            raise Interrupted from None
        finally:
            self._waiting = None

    # -- attachments ----------------------------------------------------------------------------

    def attach(self, arg: str) -> None:
        """Attach every path in ``arg`` (shell quoting), or none of them if one cannot be used."""
        if not arg:
            raise UserError("give a path: /attach PATH (quote it if it has spaces)")
        try:
            paths = shlex.split(arg)
        except ValueError as exc:  # an unbalanced quote
            raise UserError(f"cannot read the path ({exc}): quote it as /attach 'PATH'") from None
        if len(paths) > 1 and Path(arg).expanduser().exists():
            paths = [arg]  # an unquoted path with spaces, as some terminals drop it
        for path in paths:
            self.check(path)
        for path in paths:
            self.attached.append(Attachment(path=path))
            print(f"attached {path}")

    def check(self, path: str) -> None:
        """Raise the error a run would fail with, now, so a bad attachment is never kept."""
        from fleet_rlm.types import RunRequest
        from fleet_rlm.volumes import parse_volume_ref

        ref = parse_volume_ref(path)
        if ref is not None:
            self.engine.workspace.file_entry(*ref)  # NotFound names the volume or file
            return
        self.engine.validate(RunRequest(question="(attachment check)", context_paths=[path]))

    def detach(self, arg: str) -> None:
        if not self.attached:
            print("nothing attached")
            return
        if not arg:
            self.attached.clear()
            print("removed every attachment")
            return
        if not arg.isdigit() or not 1 <= int(arg) <= len(self.attached):
            raise UserError(f"no attachment {arg!r}: /detach N with N from 1 to {len(self.attached)} (see /context)")
        print(f"removed {self.attached.pop(int(arg) - 1).label()}")

    async def paste(self) -> None:
        print(f"paste the text, then a line holding only '{PASTE_END}' (or Ctrl-D) to finish", file=sys.stderr)
        lines: list[str] = []
        try:
            while (line := await self.interruptible(self.reader.read())) not in (None, PASTE_END):
                lines.append(line)
        except Interrupted:
            print("paste cancelled", file=sys.stderr)
            return
        text = "\n".join(lines)
        if not text.strip():
            print("nothing pasted")
            return
        self.attached.append(Attachment(text=text))
        print(f"pasted {len(text):,} characters")

    # -- questions ------------------------------------------------------------------------------

    async def ask(self, question: str) -> None:
        from fleet_rlm.types import RunRequest

        if self.session_id is None:
            self.session_id = await self.engine.open_session(name="terminal chat")
        req = RunRequest(
            question=question,
            context_paths=[a.path for a in self.attached if a.path is not None],
            context_text=[a.text for a in self.attached if a.text is not None],
            session_id=self.session_id,
            **limit_overrides(self.args),
        )
        run_id = None
        try:  # Ctrl-C during a run cancels that run (recorded as cancelled) and returns to the prompt
            run_id = await self.interruptible(self.engine.start_run(req))
            result = await self.interruptible(follow_started(self.engine, run_id, self.mode))
        except Interrupted:
            self.last_run = run_id or self.last_run  # /trace shows what it did before the Ctrl-C
            print(f"[cancelled · run {run_id}]" if run_id else "cancelled", file=sys.stderr)
            return
        self.attached.clear()  # attached inputs now live in the REPL
        self.last_run = result.run_id
        print(result.answer if result.answer is not None else f"(no answer: {result.error or result.stop_reason})")
        print(
            f"[{result.status} · {result.iterations} steps · {result.llm_calls} model calls · "
            f"{result.seconds:.1f}s · run {result.run_id}]",
            file=sys.stderr,
        )

    def show_trace(self, run_id: str | None) -> None:
        from fleet_rlm.cli.trace_view import render
        from fleet_rlm.core.trace import build_trace

        if not run_id:
            print("no run yet" if run_id is None else "give a run id: /open RUN_ID (see /runs)")
            return
        try:
            row = self.engine.workspace.run(run_id)  # `last`, `last~N` or a unique part of an id too
        except UserError as exc:  # unknown or ambiguous: say so and keep chatting
            print(f"{exc} (/runs lists recent ones)" if isinstance(exc, RunNotFound) else exc)
            return
        render(row, build_trace(self.engine.events(row.id)))

    async def command(self, line: str) -> bool:
        """Handle a slash command; False means quit."""
        cmd, _, arg = line.partition(" ")
        arg = arg.strip()
        if cmd in {"/quit", "/exit"}:
            return False
        if cmd == "/help":
            print(self.help)
        elif not await self.run_command(cmd, arg):
            print(f"unknown command {cmd}: /help lists the commands")
        return True

    async def run_command(self, cmd: str, arg: str) -> bool:
        """Run a command other than /quit and /help; False when there is no such command."""
        if cmd == "/attach":
            self.attach(arg)
        elif cmd == "/detach":
            self.detach(arg)
        elif cmd == "/paste":
            await self.paste()
        elif cmd == "/context":
            labels = [f"{n}. {a.label()}" for n, a in enumerate(self.attached, 1)]
            print("\n".join(labels) or "nothing attached")
        elif cmd == "/mode":
            if arg not in {"compact", "verbose", "off"}:
                raise UserError("/mode compact, /mode verbose or /mode off")
            self.mode = arg
            print(f"progress: {arg}")
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
            self.attached.clear()
            print("new session: fresh REPL, nothing attached")
        else:
            return False
        return True

    async def loop(self) -> None:
        asked_to_leave = False
        while True:
            try:
                line = await self.interruptible(self.reader.read("> "))
            except Interrupted:
                if asked_to_leave or self._twice:
                    return
                asked_to_leave = True
                print("\n(press Ctrl-C again, or type /quit, to leave)", file=sys.stderr)
                continue
            if line is None:  # Ctrl-D
                return
            asked_to_leave = False
            line = line.strip()
            if not line:
                continue
            try:
                if line.startswith("/"):
                    if not await self.command(line):
                        return
                else:
                    await self.ask(line)
            except Exception as exc:  # one line, and the session stays alive
                fail(exc)

    async def run(self) -> None:
        """``loop`` with Ctrl-C going to ``on_sigint`` instead of ending the process."""
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGINT, self.on_sigint)
        print(self.banner, file=sys.stderr)
        try:
            await self.loop()
        finally:
            loop.remove_signal_handler(signal.SIGINT)


async def _chat(settings: Any, args: argparse.Namespace) -> None:
    from fleet_rlm.core.engine import Engine

    async with Engine(settings) as engine:
        chat = Chat(engine, args)
        for path in args.context:  # `fleet --context FILE`: attached at start, checked like /attach
            chat.check(path)
            chat.attached.append(Attachment(path=path))
            print(f"attached {path}")
        await chat.run()


def cmd_chat(args: argparse.Namespace) -> int:
    asyncio.run(_chat(settings_for(args), args))
    return 0
