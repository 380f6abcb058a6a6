"""Documents and images in a context: which files they are, and their text, made by an isolated parser.

A file is a document by its name and its first bytes together (``report.pdf`` that starts with
``%PDF-``; an office file or EPUB that is a zip), so a renamed binary is still "binary". The text
comes from ``parse_worker.py`` in a separate process under the sandbox's isolation with memory and
time caps (``sandbox/isolated.py``); one process serves a whole staging and is started again after
a file crashed or stalled it, that file being skipped with the reason. Results are cached by the
content's hash (and the parser's own), so a second run over the same files converts nothing.

Choices, per format (measured on a 100-page text PDF, 2 cores; see docs/inputs.md):
PDF through pypdfium2 (PDFium: 0.2-0.4 s, an 8.8 MB wheel, BSD/Apache; pypdf took 0.9-1.4 s,
pdfplumber 14-17 s, markitdown 25-27 s and 259 MB); DOCX, PPTX, XLSX and EPUB are zips of XML that
the standard library reads with bomb checks (no lxml, none of markitdown's DOCX failures on lxml
6.2); HTML through the standard library's parser; notebooks are JSON.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import signal
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fleet_rlm.sandbox.base import SandboxError

PARSER = Path(__file__).with_name("parse_worker.py")
PARSE_MEMORY_MB = 1024  # address space of the parser process
PARSE_SECONDS = 60.0  # one file's conversion; past it the parser is killed and the file skipped
MAX_REPLY_BYTES = 512 << 20

DOCUMENT_SUFFIXES = {
    ".pdf": "pdf", ".docx": "docx", ".pptx": "pptx", ".xlsx": "xlsx", ".epub": "epub",
    ".ipynb": "ipynb", ".html": "html", ".htm": "html", ".xhtml": "html",
}  # fmt: skip
KIND_NAMES = {"pdf": "PDF", "docx": "DOCX", "pptx": "PPTX", "xlsx": "XLSX", "epub": "EPUB",
              "ipynb": "notebook", "html": "HTML"}  # fmt: skip
_ZIPS = {"docx", "pptx", "xlsx", "epub"}
IMAGE_MAGIC = ((b"\x89PNG\r\n\x1a\n", "image/png"), (b"\xff\xd8\xff", "image/jpeg"), (b"GIF87a", "image/gif"),
               (b"GIF89a", "image/gif"))  # fmt: skip


def document_kind(name: str, head: bytes) -> str | None:
    """The parser a file needs, or None (read as text, or skipped as binary)."""
    kind = DOCUMENT_SUFFIXES.get(os.path.splitext(name)[1].lower())
    if kind == "pdf" and b"%PDF-" not in head[:1024]:
        return None
    if kind in _ZIPS and not head.startswith(b"PK\x03\x04"):
        return None
    return kind


def image_type(head: bytes) -> str | None:
    """The MIME type of an image file by its first bytes (PNG, JPEG, GIF, WebP), or None."""
    for magic, mime in IMAGE_MAGIC:
        if head.startswith(magic):
            return mime
    if head[:4] == b"RIFF" and head[8:12] == b"WEBP":
        return "image/webp"
    return None


class Unconvertible(Exception):
    """The document is skipped; the message is the reason in the size report."""


@dataclass
class Converted:
    text: str
    parts: list[dict[str, Any]] = field(default_factory=list)  # spans of ``text``: page, slide, sheet...
    note: str = ""  # e.g. "300 pages"
    cached: bool = False


@functools.cache
def _parser_digest(parser: Path) -> str:
    """The parser's own hash, part of every cache key: read once a process, not once a run."""
    return hashlib.sha256(parser.read_bytes()).hexdigest()[:16]


class Converter:
    """Converts documents one at a time through one isolated parser process (started on first use)."""

    def __init__(
        self,
        cache_dir: Path | None = None,
        *,
        isolation: str = "auto",
        memory_mb: int = PARSE_MEMORY_MB,
        seconds: float = PARSE_SECONDS,
    ) -> None:
        self.cache_dir = cache_dir
        self.isolation = isolation
        self.memory_mb = memory_mb
        self.seconds = seconds
        self._proc: subprocess.Popen[bytes] | None = None
        self._version = _parser_digest(PARSER)
        self.converted = 0  # files parsed (not cached) in this staging
        self.cache_hits = 0  # documents whose text came from the cache (a remembered skip is not one)

    def convert(self, kind: str, data: bytes) -> Converted:
        key = hashlib.sha256(f"{kind}:{self._version}:".encode() + data).hexdigest()
        cached = self._cached(key)
        if cached is not None:
            self.cache_hits += 1
            return cached
        reply = self._parse(kind, data)
        self.converted += 1
        self._store(key, reply)
        if "skip" in reply:
            raise Unconvertible(reply["skip"])
        return Converted(reply["text"], reply.get("parts", []), reply.get("note", ""))

    # -- the cache (host-only, under FLEET_HOME) --------------------------------------------------

    def _cache_file(self, key: str) -> Path | None:
        return None if self.cache_dir is None else self.cache_dir / key[:2] / f"{key}.json"

    def _cached(self, key: str) -> Converted | None:
        path = self._cache_file(key)
        if path is None:
            return None
        try:
            reply = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        if "skip" in reply:  # a file that failed fails the same way again: not parsed twice
            raise Unconvertible(reply["skip"])  # a skip, not a document from the cache (cache_hits)
        return Converted(reply["text"], reply.get("parts", []), reply.get("note", ""), cached=True)

    def _store(self, key: str, reply: dict[str, Any]) -> None:
        path = self._cache_file(key)
        if path is None or reply.get("transient"):
            return
        with contextlib.suppress(OSError):
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            tmp = path.with_suffix(f".{os.getpid()}.{threading.get_ident()}.tmp")
            tmp.write_text(json.dumps(reply, ensure_ascii=False), encoding="utf-8")
            os.replace(tmp, path)

    # -- the parser process -----------------------------------------------------------------------

    def _start(self) -> subprocess.Popen[bytes]:
        import importlib.util

        from fleet_rlm.sandbox.isolated import python_command

        # The PDF library's packages, bound read-only into the parser's process (nothing else of the venv).
        specs = [importlib.util.find_spec(name) for name in ("pypdfium2", "pypdfium2_raw", "pypdfium2_cfg")]
        libs = [Path(spec.origin).parent for spec in specs if spec is not None and spec.origin]
        with python_command(PARSER, [str(self.memory_mb)], libs, self.isolation) as command:
            return subprocess.Popen(
                command.argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                env=command.env,
                pass_fds=command.pass_fds,
                start_new_session=True,
            )

    def _parse(self, kind: str, data: bytes) -> dict[str, Any]:
        if self._proc is None or self._proc.poll() is not None:
            try:
                self._proc = self._start()
            except (SandboxError, OSError) as exc:  # e.g. root with no isolation: never parse unisolated
                return {"skip": f"documents cannot be converted here: {exc}", "transient": True}
        proc = self._proc
        assert proc.stdin is not None and proc.stdout is not None
        stalled = threading.Event()

        def stall() -> None:
            stalled.set()
            self._kill(proc)

        timer = threading.Timer(self.seconds, stall)
        timer.start()
        try:
            proc.stdin.write(json.dumps({"kind": kind, "size": len(data)}).encode() + b"\n")
            proc.stdin.write(data)
            proc.stdin.flush()
            line = proc.stdout.readline(MAX_REPLY_BYTES)
        except (BrokenPipeError, OSError):
            line = b""
        finally:
            timer.cancel()
        if line.endswith(b"\n"):
            try:
                reply = json.loads(line)
            except ValueError:
                reply = None
            if isinstance(reply, dict) and ("skip" in reply or isinstance(reply.get("text"), str)):
                return reply
        self._kill(proc)
        self._proc = None
        code = proc.wait()  # reaped here: a stopped parser leaves no process behind, not even a zombie
        for stream in (proc.stdin, proc.stdout):
            with contextlib.suppress(OSError):
                if stream is not None:
                    stream.close()
        if stalled.is_set():  # not cached: a busy machine may be the cause
            return {"skip": f"its parser took longer than {self.seconds:g} s, so it was stopped", "transient": True}
        if line and not line.endswith(b"\n"):
            return {"skip": f"its text is over {MAX_REPLY_BYTES >> 20} MB"}
        sig = -code if code < 0 else code - 128 if code > 128 else None  # bwrap: 128 + the child's signal
        how = f"killed by signal {sig}" if sig else f"exit code {code}"
        if sig == signal.SIGKILL:
            how += f", likely past its {self.memory_mb} MB memory cap"
        return {"skip": f"its parser crashed ({how})"}

    @staticmethod
    def _kill(proc: subprocess.Popen[bytes]) -> None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError):
            proc.kill()

    def close(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        with contextlib.suppress(OSError):
            if proc.stdin is not None:
                proc.stdin.close()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._kill(proc)
            proc.wait()
        for stream in (proc.stdout,):
            if stream is not None:
                stream.close()

    def __enter__(self) -> Converter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
