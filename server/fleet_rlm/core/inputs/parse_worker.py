"""Document parser: runs in its own process, under the sandbox's isolation where there is one.

A file a user points the tool at may be hostile (a prompt injection is enough to make one), so the
code that parses it is treated like the model's code: no network, a read-only system, no
capabilities, an address-space and CPU cap, and nothing of the host's but the bytes it is sent.

Protocol (one request at a time): the host writes a JSON line ``{"kind", "size"}`` and then
``size`` bytes; the worker answers one JSON line, either ``{"text", "parts", "note"}`` (parts are
``{"kind": "page"|"slide"|"sheet"|"chapter"|"cell", "n", "title"?, "start", "end"}`` spans of
``text``) or ``{"skip": reason}``. A file that crashes or hangs the worker is the host's to report.

Imports only the standard library and, for PDFs, pypdfium2 (whose folder the host binds in).
"""

from __future__ import annotations

import html
import html.parser
import io
import json
import re
import resource
import sys
import zipfile
from typing import Any
from xml.etree import ElementTree

MAX_MEMBER_BYTES = 256 << 20  # one member of a zip, uncompressed: past it the file is a bomb
MAX_TOTAL_BYTES = 512 << 20  # all members read from one zip together
MAX_RATIO = 200  # uncompressed / compressed, per member, that no real office file reaches
MAX_TEXT_CHARS = 200_000_000


class Skip(Exception):
    """The file is left out; the message is the reason in the size report."""


# -- text out of markup ----------------------------------------------------------------------------

_BLOCKS = {
    "p", "div", "br", "li", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "section", "article", "header",
    "footer", "table", "ul", "ol", "pre", "blockquote", "hr", "dt", "dd", "title", "nav", "aside",
}  # fmt: skip


class _HtmlText(html.parser.HTMLParser):
    """Visible text of an HTML page: scripts, styles and templates dropped, blocks on their own lines."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.out: list[str] = []
        self._hidden = 0

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag in ("script", "style", "template", "noscript", "svg"):
            self._hidden += 1
        elif tag in _BLOCKS:
            self.out.append("\n")

    def handle_endtag(self, tag: str) -> None:
        if tag in ("script", "style", "template", "noscript", "svg"):
            self._hidden = max(0, self._hidden - 1)
        elif tag in _BLOCKS or tag in ("td", "th"):
            self.out.append("\n" if tag in _BLOCKS else "\t")

    def handle_data(self, data: str) -> None:
        if not self._hidden:
            self.out.append(data)


def html_text(markup: str) -> str:
    parser = _HtmlText()
    parser.feed(markup)
    parser.close()
    text = "".join(parser.out)
    text = re.sub(r"[ \t\r\f\v]+\n", "\n", text)
    return re.sub(r"\n{3,}", "\n\n", text).strip()


def _xml(data: bytes) -> ElementTree.Element:
    # ElementTree resolves no external entities; expat caps entity amplification (billion laughs).
    try:
        return ElementTree.fromstring(data)
    except ElementTree.ParseError as exc:
        raise Skip(f"malformed XML inside ({exc})") from None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


# -- zip containers (DOCX, PPTX, XLSX, EPUB) -------------------------------------------------------


class _Zip:
    """A zip read with bomb checks: sizes declared and real, ratio, total."""

    def __init__(self, data: bytes) -> None:
        try:
            self.zip = zipfile.ZipFile(io.BytesIO(data))
        except (zipfile.BadZipFile, ValueError) as exc:
            raise Skip(f"not a valid zip container ({exc})") from None
        self.read_total = 0

    def names(self) -> list[str]:
        return self.zip.namelist()

    def read(self, name: str) -> bytes:
        try:
            info = self.zip.getinfo(name)
        except KeyError:
            raise Skip(f"{name} is missing inside") from None
        if info.flag_bits & 0x1:
            raise Skip("encrypted (password-protected)")
        if info.file_size > MAX_MEMBER_BYTES or info.file_size > MAX_RATIO * max(info.compress_size, 1024):
            raise Skip(f"a decompression bomb ({name}: {info.file_size:,} bytes from {info.compress_size:,})")
        with self.zip.open(info) as fh:
            data = fh.read(MAX_MEMBER_BYTES + 1)  # the declared size may lie
        if len(data) > MAX_MEMBER_BYTES:
            raise Skip(f"a decompression bomb ({name} inflates past {MAX_MEMBER_BYTES >> 20} MB)")
        self.read_total += len(data)
        if self.read_total > MAX_TOTAL_BYTES:
            raise Skip(f"a decompression bomb (over {MAX_TOTAL_BYTES >> 20} MB inflated)")
        return data


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}" + ("" if n == 1 else "s")


def _natural(name: str) -> list[Any]:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", name)]


class _Builder:
    """Text with the spans of its parts."""

    def __init__(self) -> None:
        self.chunks: list[str] = []
        self.length = 0
        self.parts: list[dict[str, Any]] = []

    def add(self, kind: str, n: int, text: str, title: str | None = None) -> None:
        heading = f"--- {kind} {n}" + (f": {title}" if title else "") + " ---\n"
        start = self.length
        self._write(heading + text.rstrip() + "\n\n")
        part: dict[str, Any] = {"kind": kind, "n": n, "start": start, "end": self.length}
        if title:
            part["title"] = title
        self.parts.append(part)

    def _write(self, text: str) -> None:
        self.chunks.append(text)
        self.length += len(text)
        if self.length > MAX_TEXT_CHARS:
            raise Skip(f"its text passes {MAX_TEXT_CHARS:,} characters")

    def result(self, note: str = "") -> dict[str, Any]:
        return {"text": "".join(self.chunks), "parts": self.parts, "note": note}


def docx(data: bytes) -> dict[str, Any]:
    root = _xml(_Zip(data).read("word/document.xml"))
    paragraphs = []
    for para in root.iter():
        if _local(para.tag) != "p":
            continue
        pieces = []
        for node in para.iter():
            name = _local(node.tag)
            if name == "t" and node.text:
                pieces.append(node.text)
            elif name == "tab":
                pieces.append("\t")
            elif name in ("br", "cr"):
                pieces.append("\n")
        paragraphs.append("".join(pieces))
    text = "\n".join(paragraphs).strip()
    if not text:
        raise Skip("no text in the document")
    return {"text": text + "\n", "parts": [], "note": _count(len(paragraphs), "paragraph")}


def pptx(data: bytes) -> dict[str, Any]:
    archive = _Zip(data)
    slides = sorted((n for n in archive.names() if re.fullmatch(r"ppt/slides/slide\d+\.xml", n)), key=_natural)
    out = _Builder()
    for n, name in enumerate(slides, 1):
        root = _xml(archive.read(name))
        lines = []
        for para in root.iter():
            if _local(para.tag) == "p":
                line = "".join(t.text or "" for t in para.iter() if _local(t.tag) == "t")
                if line.strip():
                    lines.append(line)
        notes = f"ppt/notesSlides/notesSlide{name.rsplit('slide', 1)[1]}"
        if notes in archive.names():
            said = [t.text for t in _xml(archive.read(notes)).iter() if _local(t.tag) == "t" and t.text]
            if said:
                lines.append("Notes: " + " ".join(said))
        out.add("slide", n, "\n".join(lines))
    if not slides:
        raise Skip("no slides inside")
    return out.result(_count(len(slides), "slide"))


def xlsx(data: bytes) -> dict[str, Any]:
    archive = _Zip(data)
    shared: list[str] = []
    if "xl/sharedStrings.xml" in archive.names():
        for item in _xml(archive.read("xl/sharedStrings.xml")):
            shared.append("".join(t.text or "" for t in item.iter() if _local(t.tag) == "t"))
    names = _sheet_names(archive)
    sheets = sorted((n for n in archive.names() if re.fullmatch(r"xl/worksheets/sheet\d+\.xml", n)), key=_natural)
    out = _Builder()
    for n, name in enumerate(sheets, 1):
        rows = []
        for row in _xml(archive.read(name)).iter():
            if _local(row.tag) != "row":
                continue
            cells = []
            for cell in row:
                if _local(cell.tag) != "c":
                    continue
                kind = cell.get("t")
                value = next((v.text or "" for v in cell if _local(v.tag) == "v"), "")
                if kind == "s" and value.isdigit() and int(value) < len(shared):
                    value = shared[int(value)]
                elif kind == "inlineStr":
                    value = "".join(t.text or "" for t in cell.iter() if _local(t.tag) == "t")
                cells.append(value)
            if any(cells):
                rows.append("\t".join(cells))
        out.add("sheet", n, "\n".join(rows), names.get(n))
    if not sheets:
        raise Skip("no sheets inside")
    return out.result(_count(len(sheets), "sheet"))


def _sheet_names(archive: _Zip) -> dict[int, str]:
    if "xl/workbook.xml" not in archive.names():
        return {}
    sheets = [s for s in _xml(archive.read("xl/workbook.xml")).iter() if _local(s.tag) == "sheet"]
    return {n: s.get("name") or "" for n, s in enumerate(sheets, 1)}


def epub(data: bytes) -> dict[str, Any]:
    archive = _Zip(data)
    container = _xml(archive.read("META-INF/container.xml"))
    opf_path = next((e.get("full-path") for e in container.iter() if _local(e.tag) == "rootfile"), None)
    if not opf_path:
        raise Skip("no package document inside")
    opf = _xml(archive.read(opf_path))
    base = opf_path.rsplit("/", 1)[0] + "/" if "/" in opf_path else ""
    manifest = {e.get("id"): e.get("href") for e in opf.iter() if _local(e.tag) == "item"}
    spine = [manifest.get(e.get("idref")) for e in opf.iter() if _local(e.tag) == "itemref"]
    out = _Builder()
    for n, href in enumerate((h for h in spine if h), 1):
        text = html_text(archive.read(base + href).decode("utf-8", "replace"))
        out.add("chapter", n, text)
    if not out.parts:
        raise Skip("no chapters inside")
    return out.result(_count(len(out.parts), "chapter"))


def notebook(data: bytes) -> dict[str, Any]:
    try:
        book = json.loads(data)
        cells = book["cells"]
    except (ValueError, KeyError, TypeError):
        raise Skip("not a Jupyter notebook (no cells)") from None
    out = _Builder()
    for n, cell in enumerate(cells, 1):
        source = cell.get("source", "")
        body = "".join(source) if isinstance(source, list) else str(source)
        for output in cell.get("outputs", []) or []:
            shown = output.get("text") or (output.get("data") or {}).get("text/plain") or ""
            if shown:
                body += "\n# output:\n" + ("".join(shown) if isinstance(shown, list) else str(shown))
        out.add("cell", n, body, cell.get("cell_type"))
    return out.result(_count(len(cells), "cell"))


def page(data: bytes) -> dict[str, Any]:
    text = html_text(data.decode("utf-8", "replace"))
    if not text:
        raise Skip("no visible text in the page")
    return {"text": text + "\n", "parts": [], "note": ""}


def pdf(data: bytes) -> dict[str, Any]:
    import pypdfium2 as pdfium

    try:
        document = pdfium.PdfDocument(data)
    except pdfium.PdfiumError as exc:
        reason = str(exc)
        if "password" in reason.lower():
            raise Skip("encrypted (password-protected)") from None
        raise Skip(f"not a readable PDF ({reason})") from None
    out = _Builder()
    empty = 0
    count = len(document)
    for index in range(count):
        page_ = document[index]
        text = page_.get_textpage().get_text_range()
        if not text.strip():
            empty += 1
        out.add("page", index + 1, text.replace("\r\n", "\n").replace("\r", "\n"))
    if count and empty == count:
        raise Skip(f"no text layer, {count} pages; OCR is not built in")
    note = _count(count, "page") + (f", {empty} without a text layer (OCR is not built in)" if empty else "")
    return out.result(note)


CONVERTERS = {"pdf": pdf, "docx": docx, "pptx": pptx, "xlsx": xlsx, "epub": epub, "ipynb": notebook, "html": page}


def _read_exactly(stream: Any, size: int) -> bytes:
    chunks, left = [], size
    while left:
        chunk = stream.read(min(left, 1 << 20))
        if not chunk:
            raise EOFError
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def main() -> None:
    memory_mb = int(sys.argv[1]) if len(sys.argv) > 1 else 1024
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    if len(sys.argv) > 2:
        sys.path.insert(0, sys.argv[2])  # where the host bound pypdfium2
    stdin, stdout = sys.stdin.buffer, sys.stdout
    while line := stdin.readline():
        request = json.loads(line)
        data = _read_exactly(stdin, int(request["size"]))
        try:
            reply = CONVERTERS[request["kind"]](data)
        except Skip as exc:
            reply = {"skip": str(exc)}
        except MemoryError:
            reply = {"skip": f"needs more than {memory_mb} MB to parse"}
        except RecursionError:
            reply = {"skip": "nested too deeply to parse"}
        except ImportError as exc:  # this machine's install, not the file: not cached
            reply = {"skip": f"the {request['kind']} converter is not installed ({exc})", "transient": True}
        except Exception as exc:  # a parser's own bug on a strange file: the file is skipped
            reply = {"skip": f"the {request['kind']} parser failed ({type(exc).__name__}: {str(exc)[:200]})"}
        del data
        stdout.write(json.dumps(reply, ensure_ascii=False) + "\n")
        stdout.flush()


if __name__ == "__main__":
    main()
