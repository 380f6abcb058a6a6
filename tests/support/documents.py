"""Real document files made from scratch for the tests: PDF (text, scanned, encrypted, broken), DOCX,
PPTX, XLSX, EPUB, a notebook, an HTML page and PNG images, each in the format's own bytes, so the
converters read what a user's files would give them. Nothing here parses; it only writes."""

from __future__ import annotations

import io
import json
import struct
import zipfile
import zlib
from pathlib import Path


def _pdf_escape(text: str) -> str:
    return text.replace("\\", "\\\\").replace("(", "\\(").replace(")", "\\)")


def pdf(pages: list[str], *, encrypted: bool = False, scanned: bool = False) -> bytes:
    """A PDF whose pages carry ``pages`` as text (Helvetica, one line per line of text); ``scanned``
    pages carry a drawing and no text layer; ``encrypted`` asks for a password nobody knows."""
    objects: list[bytes] = []
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(len(pages)))
    objects.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objects.append(f"<< /Type /Pages /Kids [{kids}] /Count {len(pages)} >>".encode())
    objects.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        if scanned:
            stream = b"0.5 g 72 72 400 600 re f"
        else:
            lines = "".join(f"({_pdf_escape(line)}) Tj T* " for line in text.splitlines() or [""])
            stream = f"BT /F1 11 Tf 14 TL 72 760 Td {lines}ET".encode("latin-1", "replace")
        objects.append(
            f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
            f"/Contents {5 + 2 * i} 0 R >>".encode()
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    trailer_extra = b""
    if encrypted:
        objects.append(b"<< /Filter /Standard /V 1 /R 2 /O <" + b"41" * 32 + b"> /U <" + b"42" * 32 + b"> /P -4 >>")
        trailer_extra = f" /Encrypt {len(objects)} 0 R /ID [<{'ab' * 16}> <{'ab' * 16}>]".encode()
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n%\xe2\xe3\xcf\xd3\n")
    offsets = []
    for number, body in enumerate(objects, 1):
        offsets.append(out.tell())
        out.write(b"%d 0 obj\n" % number + body + b"\nendobj\n")
    xref = out.tell()
    out.write(b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1))
    for offset in offsets:
        out.write(b"%010d 00000 n \n" % offset)
    out.write(b"trailer\n<< /Size %d /Root 1 0 R" % (len(objects) + 1) + trailer_extra + b" >>\n")
    out.write(b"startxref\n%d\n%%%%EOF\n" % xref)
    return out.getvalue()


def _zip(members: dict[str, str | bytes]) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return out.getvalue()


_W = 'xmlns:w="http://schemas.openxmlformats.org/wordprocessingml/2006/main"'
_A = 'xmlns:a="http://schemas.openxmlformats.org/drawingml/2006/main"'
_P = 'xmlns:p="http://schemas.openxmlformats.org/presentationml/2006/main"'
_S = 'xmlns="http://schemas.openxmlformats.org/spreadsheetml/2006/main"'


def _esc(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def docx(paragraphs: list[str]) -> bytes:
    body = "".join(f"<w:p><w:r><w:t>{_esc(p)}</w:t></w:r></w:p>" for p in paragraphs)
    document = f'<?xml version="1.0" encoding="UTF-8"?><w:document {_W}><w:body>{body}</w:body></w:document>'
    return _zip({"[Content_Types].xml": "<Types/>", "word/document.xml": document})


def pptx(slides: list[list[str]]) -> bytes:
    members: dict[str, str | bytes] = {"[Content_Types].xml": "<Types/>"}
    for n, lines in enumerate(slides, 1):
        paras = "".join(f"<a:p><a:r><a:t>{_esc(line)}</a:t></a:r></a:p>" for line in lines)
        members[f"ppt/slides/slide{n}.xml"] = (
            f"<p:sld {_P} {_A}><p:cSld><p:spTree><p:sp><p:txBody>{paras}</p:txBody></p:sp></p:spTree></p:cSld></p:sld>"
        )
    return _zip(members)


def xlsx(sheets: dict[str, list[list[str | int]]]) -> bytes:
    shared: list[str] = []
    members: dict[str, str | bytes] = {"[Content_Types].xml": "<Types/>"}
    names = "".join(f'<sheet name="{_esc(name)}" sheetId="{n}"/>' for n, name in enumerate(sheets, 1))
    members["xl/workbook.xml"] = f"<workbook {_S}><sheets>{names}</sheets></workbook>"
    for n, rows in enumerate(sheets.values(), 1):
        xml_rows = []
        for r, row in enumerate(rows, 1):
            cells = []
            for value in row:
                if isinstance(value, int):
                    cells.append(f"<c><v>{value}</v></c>")
                else:
                    shared.append(value)
                    cells.append(f'<c t="s"><v>{len(shared) - 1}</v></c>')
            xml_rows.append(f'<row r="{r}">{"".join(cells)}</row>')
        members[f"xl/worksheets/sheet{n}.xml"] = (
            f"<worksheet {_S}><sheetData>{''.join(xml_rows)}</sheetData></worksheet>"
        )
    strings = "".join(f"<si><t>{_esc(s)}</t></si>" for s in shared)
    members["xl/sharedStrings.xml"] = f"<sst {_S}>{strings}</sst>"
    return _zip(members)


def epub(chapters: list[str]) -> bytes:
    items = "".join(
        f'<item id="c{n}" href="c{n}.xhtml" media-type="application/xhtml+xml"/>' for n in range(len(chapters))
    )
    spine = "".join(f'<itemref idref="c{n}"/>' for n in range(len(chapters)))
    members: dict[str, str | bytes] = {
        "mimetype": "application/epub+zip",
        "META-INF/container.xml": '<container><rootfiles><rootfile full-path="OEBPS/book.opf"/></rootfiles>'
        "</container>",
        "OEBPS/book.opf": f"<package><manifest>{items}</manifest><spine>{spine}</spine></package>",
    }
    for n, text in enumerate(chapters):
        members[f"OEBPS/c{n}.xhtml"] = f"<html><body><p>{_esc(text)}</p></body></html>"
    return _zip(members)


def notebook(cells: list[str]) -> bytes:
    book = {"cells": [{"cell_type": "code", "source": [c], "outputs": []} for c in cells], "nbformat": 4}
    return json.dumps(book).encode()


def zip_bomb(name: str = "word/document.xml", inflated: int = 1 << 30) -> bytes:
    """A zip whose one member inflates to ``inflated`` bytes from about a thousandth of that."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as archive, archive.open(name, "w", force_zip64=True) as fh:
        block = b"\0" * (1 << 20)
        for _ in range(inflated >> 20):
            fh.write(block)
    return out.getvalue()


def png(width: int = 4, height: int = 3, rgb: tuple[int, int, int] = (200, 30, 30)) -> bytes:
    """A real PNG of one colour."""

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    raw = b"".join(b"\0" + bytes(rgb) * width for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw)) + chunk(b"IEND", b"")


def write(folder: Path, files: dict[str, bytes | str]) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name, data in files.items():
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data.encode() if isinstance(data, str) else data)
    return folder
