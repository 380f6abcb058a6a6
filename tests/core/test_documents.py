"""Documents in a context: converted to text by the isolated parser, with page, slide and sheet
spans in ``sources``; hostile or unreadable files skipped with their reason; conversions cached.

The files are real ones in their formats' own bytes (tests/support/documents.py), the parser is the
real separate process (under bubblewrap where it is usable), and runs go through the engine, the
real sandbox and the scripted model server."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleet_rlm.core.context import stage_context
from fleet_rlm.core.engine import Engine
from fleet_rlm.core.inputs import documents
from fleet_rlm.core.inputs.documents import Converter
from fleet_rlm.sandbox.local import detect_isolation
from fleet_rlm.types import RunRequest
from tests.support import documents as make
from tests.support.oracle_lm import Image, OracleLM, Scenario

pytestmark = pytest.mark.anyio

PAGES = [f"Page {n} of the annual report.\nNothing to see on page {n}." for n in range(1, 301)]
PAGES[36] = "Page 37 of the annual report.\nThe vault code is 7731."
SLIDES = [["Launch plan"], ["Timeline", "The launch date is May 4."], ["Questions"]]


def folder_of_everything(root: Path) -> Path:
    return make.write(
        root,
        {
            "report.pdf": make.pdf(PAGES),
            "memo.docx": make.docx(["Dear team,", "The budget is 40 units."]),
            "deck.pptx": make.pptx(SLIDES),
            "sheet.xlsx": make.xlsx({"Stock": [["item", "count"], ["apples", 12]], "Notes": [["fine"]]}),
            "page.html": "<html><head><script>steal()</script><style>p{}</style></head>"
            "<body><h1>Status</h1><p>All systems nominal.</p></body></html>",
            "red.png": make.png(rgb=(220, 20, 20)),
            "blue.png": make.png(8, 8, rgb=(20, 20, 220)),
            "analysis.ipynb": make.notebook(["total = 6 * 7", "print(total)"]),
            "book.epub": make.epub(["It was a dark night.", "The end."]),
        },
    )


def test_every_document_kind_becomes_text_with_its_parts(tmp_path: Path) -> None:
    folder = folder_of_everything(tmp_path / "in")
    with Converter(tmp_path / "cache") as converter:
        staged = stage_context(tmp_path / "scratch" / "context.txt", paths=[str(folder)], converter=converter)
    text = staged.path.read_text(encoding="utf-8")
    by_name = {Path(s.name).name: s for s in staged.sources}
    assert sorted(by_name) == sorted(p.name for p in folder.iterdir())
    assert staged.skipped == []
    pdf = by_name["report.pdf"]
    assert pdf.kind == "pdf" and len(pdf.parts) == 300 and pdf.note == "300 pages"
    page_37 = pdf.parts[36]
    assert page_37["kind"] == "page" and page_37["n"] == 37
    assert "The vault code is 7731." in text[page_37["start"] : page_37["end"]]
    assert "7731" not in text[pdf.parts[35]["start"] : pdf.parts[35]["end"]]
    slide_2 = by_name["deck.pptx"].parts[1]
    assert "The launch date is May 4." in text[slide_2["start"] : slide_2["end"]]
    sheets = by_name["sheet.xlsx"].parts
    assert [p.get("title") for p in sheets] == ["Stock", "Notes"]
    assert "apples\t12" in text[sheets[0]["start"] : sheets[0]["end"]]
    assert "budget is 40 units" in text[by_name["memo.docx"].start : by_name["memo.docx"].end]
    page = text[by_name["page.html"].start : by_name["page.html"].end]
    assert "All systems nominal." in page and "steal()" not in page and "<p>" not in page
    assert "total = 6 * 7" in text[by_name["analysis.ipynb"].start : by_name["analysis.ipynb"].end]
    assert len(by_name["book.epub"].parts) == 2
    images = {Path(i.name).name: i for i in staged.images}
    assert sorted(images) == ["blue.png", "red.png"]
    assert images["red.png"].path.read_bytes() == (folder / "red.png").read_bytes()
    assert by_name["red.png"].to_dict()["mime"] == "image/png"
    report = staged.report()
    assert "7 document(s) converted" in report and "2 image(s)" in report and "(PDF, 300 pages)" in report


def test_a_second_staging_converts_nothing(tmp_path: Path) -> None:
    folder = folder_of_everything(tmp_path / "in")
    with Converter(tmp_path / "cache") as converter:
        first = stage_context(tmp_path / "a" / "context.txt", paths=[str(folder)], converter=converter)
    with Converter(tmp_path / "cache") as converter:
        second = stage_context(tmp_path / "b" / "context.txt", paths=[str(folder)], converter=converter)
    assert (first.converted, first.cache_hits) == (7, 0)
    assert (second.converted, second.cache_hits) == (0, 7)
    assert first.path.read_text() == second.path.read_text()
    assert [s.to_dict() for s in first.sources] == [s.to_dict() for s in second.sources]
    (folder / "memo.docx").write_bytes(make.docx(["A new memo."]))  # changed content: converted again
    with Converter(tmp_path / "cache") as converter:
        third = stage_context(tmp_path / "c" / "context.txt", paths=[str(folder)], converter=converter)
    assert (third.converted, third.cache_hits) == (1, 6)


def test_hostile_and_unreadable_documents_are_skipped_with_their_reason(tmp_path: Path) -> None:
    folder = make.write(
        tmp_path / "in",
        {
            "fine.txt": "a plain note",
            "scanned.pdf": make.pdf(["x"] * 214, scanned=True),
            "locked.pdf": make.pdf(["secret"], encrypted=True),
            "broken.pdf": b"%PDF-1.7\n1 0 obj << /Type /Catalog >> garbage",
            "bomb.docx": make.zip_bomb(),
            "bomb.xlsx": make.zip_bomb("xl/worksheets/sheet1.xml"),
            "notazip.docx": b"PK\x03\x04 and then nothing a zip has",
        },
    )
    with Converter(tmp_path / "cache") as converter:
        staged = stage_context(tmp_path / "s" / "context.txt", paths=[str(folder)], converter=converter)
    reasons = {Path(line.split(": ", 1)[0]).name: line.split(": ", 1)[1] for line in staged.skipped}
    assert reasons["scanned.pdf"] == "no text layer, 214 pages; OCR is not built in"
    assert reasons["locked.pdf"] == "encrypted (password-protected)"
    assert reasons["broken.pdf"].startswith("not a readable PDF")
    assert reasons["bomb.docx"].startswith("a decompression bomb")
    assert reasons["bomb.xlsx"].startswith("a decompression bomb")
    assert reasons["notazip.docx"].startswith("not a valid zip container")
    assert [Path(s.name).name for s in staged.sources] == ["fine.txt"]


def test_a_parser_that_stalls_or_dies_costs_one_file_not_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    folder = make.write(tmp_path / "in", {"a.pdf": make.pdf(PAGES), "b.docx": make.docx(["still read"])})
    (tmp_path / "note.txt").write_text("a note")
    others = set(children())  # what this process already runs (servers of other tests in the same worker)
    # Parses that cannot finish in time: each killed with its process, the file skipped, a new process
    # started for the next; the text beside them is read, and no parser is left running.
    with Converter(None, seconds=0.0005) as converter:
        stalled = stage_context(
            tmp_path / "s1" / "context.txt", paths=[str(folder), str(tmp_path / "note.txt")], converter=converter
        )
        assert converter._proc is None
    assert [Path(s.name).name for s in stalled.sources] == ["note.txt"]
    assert all("took longer than 0.0005 s" in line for line in stalled.skipped) and len(stalled.skipped) == 2
    assert set(children()) - others == set()
    # A parser that dies on a file (as a PDF library's bug would make it): that file's skip line, and
    # the next file is parsed by a new process. The crashing parser is the real one plus a fault.
    crashing = tmp_path / "parse_worker.py"
    crashing.write_text(
        documents.PARSER.read_text().replace(
            "def pdf(data: bytes) -> dict[str, Any]:\n",
            "def pdf(data: bytes) -> dict[str, Any]:\n    import os, signal\n"
            "    os.kill(os.getpid(), signal.SIGSEGV)\n",
        )
    )
    monkeypatch.setattr(documents, "PARSER", crashing)
    with Converter(None) as converter:
        crashed = stage_context(tmp_path / "s2" / "context.txt", paths=[str(folder)], converter=converter)
    assert crashed.skipped == [f"{folder / 'a.pdf'}: its parser crashed (killed by signal 11)"]
    assert [s.kind for s in crashed.sources] == ["docx"]
    monkeypatch.undo()
    with Converter(None) as converter:
        ok = stage_context(tmp_path / "s3" / "context.txt", paths=[str(folder)], converter=converter)
    assert ok.skipped == [] and {s.kind for s in ok.sources} == {"pdf", "docx"}


def children() -> list[int]:
    """Processes this test process started that are still there (zombies excluded)."""
    mine = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == os.getpid() and fields[0] != "Z":
                mine.append(int(entry.name))
    return mine


def test_the_parser_runs_isolated_and_leaves_the_host_unchanged(tmp_path: Path) -> None:
    """The parser's process is the sandbox's: a script run by the same command cannot write the host."""
    if detect_isolation()[0] != "bwrap":
        pytest.skip(f"bubblewrap is unusable here: {detect_isolation()[1]}")
    from fleet_rlm.sandbox.isolated import python_command

    target = Path(__file__)  # a file of this checkout
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    script = tmp_path / "probe.py"
    script.write_text(
        "import ctypes, os, socket, sys\n"
        "libc = ctypes.CDLL(None, use_errno=True)\n"
        "head, data = (ctypes.c_uint32 * 2)(0x20080522, 0), (ctypes.c_uint32 * 6)()\n"
        "libc.capget(head, data)\n"
        f"try:\n    open({str(target)!r}, 'a').write('# owned')\n    wrote = 'yes'\n"
        "except OSError as e:\n    wrote = e.strerror\n"
        "try:\n    socket.create_connection(('1.1.1.1', 80), timeout=2); net = 'yes'\n"
        "except OSError as e:\n    net = 'no'\n"
        "print(data[0] | data[3] << 32, os.getuid(), wrote, net, os.path.exists('/proc'), sep='|')\n"
    )
    with python_command(script, [], []) as command:
        proc = subprocess.run(command.argv, env=command.env, pass_fds=command.pass_fds, capture_output=True, text=True)
    caps, uid, wrote, net, proc_fs = proc.stdout.strip().split("|")
    assert (caps, uid, net, proc_fs) == ("0", "65534", "no", "False"), proc.stdout + proc.stderr
    assert wrote != "yes"
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before


async def test_a_run_answers_from_a_pdf_page_and_a_slide(
    fleet_env: dict, oracle: OracleLM, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("FLEET_SANDBOX", "local")
    folder = folder_of_everything(tmp_path / "docs")
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    steps = [
        "pdf = next(s for s in sources if s['name'].endswith('report.pdf'))\n"
        "deck = next(s for s in sources if s['name'].endswith('deck.pptx'))\n"
        "page = pdf['parts'][36]; slide = deck['parts'][1]\n"
        "print(context[page['start']:page['end']]); print(context[slide['start']:slide['end']])",
        "import hashlib\nred = next(s for s in sources if s['name'].endswith('red.png'))\n"
        "print('file', red['file'], hashlib.sha256(open(red['file'], 'rb').read()).hexdigest())\n"
        "colour = llm_query('What colour is this?', images=[red['name']])\nprint(colour)",
        "import re\ncode = re.search(r'vault code is (\\d+)', context).group(1)\n"
        "date = re.search(r'launch date is ([^.]+)', context).group(1)\nSUBMIT(code + ' / ' + date + ' / ' + colour)",
    ]
    red = (folder / "red.png").read_bytes()

    def look(prompt: str, images: list[Image]) -> str:  # the scripted vision model checks what arrived
        return "red" if [(i.mime, i.data) for i in images] == [("image/png", red)] else "not the red image"

    oracle.add(Scenario("vault and launch", steps, see=look))
    async with Engine() as engine:
        result = await engine.run(RunRequest("vault and launch: what are they?", context_paths=[str(folder)]))
        events = engine.events(result.run_id)
    assert result.status == "succeeded", result.error
    assert result.answer == "7731 / May 4 / red"
    loaded = next(e for e in events if e["kind"] == "context.loaded")["data"]
    assert "(PDF, 300 pages)" in loaded["report"] and "2 image(s)" in loaded["report"]
    assert (loaded["documents"], loaded["pages"], loaded["images"], loaded["skipped_count"]) == (7, 300, 2, 0)
    first_prompt = str(oracle.requests("root")[0].messages)
    assert "300 page(s) with spans" in first_prompt and "'start': 1900" not in first_prompt  # counted, not listed
    code_steps = [e["data"]["output"] for e in events if e["kind"] == "code.executed"]
    # The image is a file the code can open too, with the host file's bytes.
    assert f"file inputs/images/1-red.png {hashlib.sha256(red).hexdigest()}" in code_steps[1]
    assert "data:image" not in str([r.messages for r in oracle.requests("root")])  # pixels only in the sub-call
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_the_cli_reads_a_folder_of_only_documents(fleet_env: dict, oracle: OracleLM, tmp_path: Path) -> None:
    folder = make.write(tmp_path / "pdfs", {"only.pdf": make.pdf(["The answer is 42."])})
    oracle.add(Scenario("only pdfs", ["import re\nSUBMIT(re.search(r'answer is (\\d+)', context).group(1))"]))
    cli = Path(sys.executable).parent / "fleet-rlm"
    proc = subprocess.run(
        [str(cli), "run", "only pdfs: the answer?", "--context", str(folder)],
        capture_output=True, text=True, env={**os.environ, **fleet_env}, timeout=120, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "42" or "42" in proc.stdout
