"""Context staging over real folders: odd files are skipped with a report line, never fail or hang."""

from __future__ import annotations

import json
import os
import shutil
import socket
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from fleet_rlm.core.context import ContextError, StagedContext, _File, _read_bytes, stage_context
from fleet_rlm.volumes import LocalVolumes
from tests.support.bounded import finishes


def staged_names(staged: StagedContext) -> list[str]:
    return [s.name for s in staged.sources]


def skip_reasons(staged: StagedContext) -> dict[str, str]:
    return dict(line.split(": ", 1) for line in staged.skipped)


def test_odd_files_in_a_folder_are_skipped_each_with_a_line(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "good.txt").write_text("good text")
    (docs / "latin1.txt").write_bytes(b"caf\xe9 au lait")
    (docs / "blob.bin").write_bytes(b"\x7fELF\x00\x01" * 100)
    (docs / "huge.log").write_text("y" * 5000)
    (docs / "sub" / "nested.txt").write_text("nested")
    (docs / "dangling").symlink_to(tmp_path / "nowhere")
    (docs / "alias.txt").symlink_to(docs / "good.txt")
    (docs / "loop").symlink_to(docs, target_is_directory=True)
    os.mkfifo(docs / "pipe")
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(docs / "sock"))
    try:
        staged = finishes(
            lambda: stage_context(tmp_path / "out" / "ctx.txt", paths=[str(docs)], max_file_bytes=4096),
            pipes=(docs / "pipe",),
        )
    finally:
        server.close()
    assert staged_names(staged) == [f"{docs}/{n}" for n in ("alias.txt", "good.txt", "latin1.txt", "sub/nested.txt")]
    text = (tmp_path / "out" / "ctx.txt").read_text(encoding="utf-8")
    assert "caf\ufffd au lait" in text and "nested" in text  # non-UTF-8 decoded with replacement
    reasons = skip_reasons(staged)
    assert reasons == {
        f"{docs}/blob.bin": "binary",
        f"{docs}/dangling": "dangling link",
        f"{docs}/huge.log": "too large (5,000 bytes; the limit is 4,096)",
        f"{docs}/loop": "link to a folder (not followed)",
        f"{docs}/pipe": "a named pipe, not a regular file",
        f"{docs}/sock": "a socket, not a regular file",
    }
    report = staged.report()
    assert "skipped 6 file(s):" in report and f"{docs}/pipe: a named pipe" in report


def test_a_named_pipe_given_directly_never_hangs(tmp_path: Path) -> None:
    pipe = tmp_path / "pipe"
    os.mkfifo(pipe)
    with pytest.raises(ContextError, match=r"no text found.*named pipe"):
        finishes(lambda: stage_context(tmp_path / "ctx.txt", paths=[str(pipe)]), pipes=(pipe,))


def test_a_file_that_changes_while_read_is_skipped(tmp_path: Path) -> None:
    log = tmp_path / "live.log"
    log.write_text("first line\n")

    def open_then_grow() -> tuple[int, os.stat_result]:
        fd = os.open(log, os.O_RDONLY)
        before = os.fstat(fd)
        with log.open("a") as writer:  # a writer appends between our open and the end of the read
            writer.write("second line\n")
        return fd, before

    with pytest.raises(Exception, match="changed while being read"):
        _read_bytes(_File("live.log", open_then_grow), 1 << 20)


def _stage_unprivileged(folder: Path, dest: Path) -> dict[str, object]:
    """Stage ``folder`` as the unprivileged user 'nobody' (root reads any file regardless of mode)."""
    if os.geteuid() != 0:
        staged = stage_context(dest, paths=[str(folder)])
        return {"names": staged_names(staged), "skipped": staged.skipped}
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child drops to nobody, stages, reports as JSON and exits at once
        try:
            os.close(read_end)
            os.setgid(65534)
            os.setuid(65534)
            staged = stage_context(dest, paths=[str(folder)])
            result = {"names": staged_names(staged), "skipped": staged.skipped}
        except BaseException as exc:
            result = {"error": repr(exc)}
        os.write(write_end, json.dumps(result).encode())
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        data = finishes(pipe.read)
    os.waitpid(pid, 0)
    return json.loads(data)


@pytest.fixture
def world_dir() -> Iterator[Path]:
    """A folder every user can enter (pytest's own tmp folders are private to their owner)."""
    folder = Path(tempfile.mkdtemp(prefix="fleet-ctx-"))
    folder.chmod(0o755)
    try:
        yield folder
    finally:
        for path in folder.rglob("*"):
            if not path.is_symlink():
                path.chmod(0o700)
        shutil.rmtree(folder)


def test_unreadable_files_and_folders_are_skipped(world_dir: Path) -> None:
    base = world_dir / "shared"
    (base / "locked").mkdir(parents=True)
    (base / "ok.txt").write_text("readable")
    (base / "secret.txt").write_text("no access")
    (base / "locked" / "inner.txt").write_text("no access either")
    out = world_dir / "out"
    out.mkdir()
    out.chmod(0o777)  # the unprivileged stager writes its staged file here
    base.chmod(0o755)
    (base / "ok.txt").chmod(0o644)
    (base / "secret.txt").chmod(0o000)
    (base / "locked").chmod(0o000)
    result = _stage_unprivileged(base, out / "ctx.txt")
    assert "error" not in result, result
    assert result["names"] == [f"{base}/ok.txt"]
    assert sorted(result["skipped"]) == [  # type: ignore[arg-type]
        f"{base}/locked/: unreadable folder (Permission denied)",
        f"{base}/secret.txt: unreadable (permission denied)",
    ]


def make_repo(root: Path) -> Path:
    repo = root / "repo"
    for folder in (".git", "build", "src", "node_modules", ".venv"):
        (repo / folder).mkdir(parents=True)
    files = {
        ".gitignore": "# comment\n*.log\nbuild/\n/top-only.txt\n!keep.log\n",
        "src/.gitignore": "gen_*.py\n",
        "a.txt": "a",
        "x.log": "x",
        "keep.log": "keep",
        "build/out.txt": "out",
        "top-only.txt": "t",
        "src/top-only.txt": "s",
        "src/gen_1.py": "g",
        "src/main.py": "m",
        "src/debug.log": "d",
        ".hidden.txt": "h",
        "node_modules/m.js": "n",
        ".venv/v.py": "v",
    }
    for rel, text in files.items():
        (repo / rel).write_text(text)
    return repo


def test_gitignore_hidden_and_tool_folders_are_left_out_by_default(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    staged = stage_context(tmp_path / "ctx.txt", paths=[str(repo)])
    rel = sorted(n.removeprefix(f"{repo}/") for n in staged_names(staged))
    assert rel == ["a.txt", "keep.log", "src/main.py", "src/top-only.txt"]
    assert sorted(staged.excluded) == sorted([
        ".git/", ".gitignore", ".hidden.txt", ".venv/", "build/", "node_modules/",
        "src/.gitignore", "src/debug.log", "src/gen_1.py", "top-only.txt", "x.log",
    ])  # fmt: skip
    assert "left out 11 hidden or ignored path(s)" in staged.report()
    # A subfolder of the work tree still honours the .gitignore files above it.
    sub = stage_context(tmp_path / "ctx.txt", paths=[str(repo / "src")])
    assert sorted(n.removeprefix(f"{repo}/src/") for n in staged_names(sub)) == ["main.py", "top-only.txt"]


def test_include_hidden_reads_everything(tmp_path: Path) -> None:
    repo = make_repo(tmp_path)
    staged = stage_context(tmp_path / "ctx.txt", paths=[str(repo)], include_hidden=True)
    assert len(staged.sources) == 14 and staged.excluded == []


def test_gitignore_only_applies_in_a_git_work_tree(tmp_path: Path) -> None:
    folder = tmp_path / "plain"
    folder.mkdir()
    (folder / ".gitignore").write_text("*.log\n")
    (folder / "app.log").write_text("log line")
    staged = stage_context(tmp_path / "ctx.txt", paths=[str(folder)])
    assert staged_names(staged) == [f"{folder}/app.log"]


def test_a_folder_with_only_hidden_files_says_how_to_include_them(tmp_path: Path) -> None:
    folder = tmp_path / "dots"
    folder.mkdir()
    (folder / ".env").write_text("x")
    with pytest.raises(ContextError, match=r"holds no files.*1 hidden or ignored"):
        stage_context(tmp_path / "ctx.txt", paths=[str(folder)])


def test_volume_sources_never_follow_links_or_open_pipes(tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("TOP-SECRET")
    vols = LocalVolumes(tmp_path / "volumes")
    vols.write("notes", "memory/plan.md", "ship it")
    vols.write("notes", "memory/.draft.md", "hidden draft")
    vol = vols.path("notes")
    (vol / "memory" / "leak.txt").symlink_to(outside / "secret.txt")
    (vol / "memory" / "leakdir").symlink_to(outside, target_is_directory=True)
    os.mkfifo(vol / "memory" / "pipe")
    staged = finishes(
        lambda: stage_context(tmp_path / "ctx.txt", paths=["vol:notes/memory"], volumes=vols),
        pipes=(vol / "memory" / "pipe",),
    )
    assert staged_names(staged) == ["vol:notes/memory/plan.md"]
    assert skip_reasons(staged) == {
        "vol:notes/memory/leak.txt": "symbolic link (links in volumes are never followed)",
        "vol:notes/memory/leakdir": "symbolic link (links in volumes are never followed)",
        "vol:notes/memory/pipe": "a pipe, socket or device, not a regular file",
    }
    assert staged.excluded == ["vol:notes/memory/.draft.md"]
    assert "TOP-SECRET" not in (tmp_path / "ctx.txt").read_text()
    with pytest.raises(ContextError, match="'memory/leakdir' in volume 'notes' is a symbolic link"):
        stage_context(tmp_path / "ctx.txt", paths=["vol:notes/memory/leakdir/secret.txt"], volumes=vols)
    with pytest.raises(ContextError, match=r"no text found.*symbolic link"):
        stage_context(tmp_path / "ctx.txt", paths=["vol:notes/memory/leak.txt"], volumes=vols)
    named = stage_context(tmp_path / "ctx.txt", paths=["vol:notes/memory/.draft.md"], volumes=vols)
    assert staged_names(named) == ["vol:notes/memory/.draft.md"]  # named explicitly: read


def test_roots_confine_host_files_reached_through_links(tmp_path: Path) -> None:
    allowed = tmp_path / "shared"
    allowed.mkdir()
    (allowed / "ok.txt").write_text("fine")
    (tmp_path / "private.txt").write_text("secret")
    (allowed / "link.txt").symlink_to(tmp_path / "private.txt")
    staged = stage_context(tmp_path / "ctx.txt", paths=[str(allowed)], roots=[allowed.resolve()])
    assert staged_names(staged) == [f"{allowed}/ok.txt"]
    assert skip_reasons(staged) == {f"{allowed}/link.txt": "outside FLEET_CONTEXT_ROOTS"}


def test_the_staged_file_is_never_written_through_a_link(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("untouched")
    dest = tmp_path / "ctx.txt"
    dest.symlink_to(victim)
    with pytest.raises(OSError):
        stage_context(dest, texts=["payload"])
    assert victim.read_text() == "untouched"


def test_a_real_stdlib_copy_with_a_dangling_link_stages(tmp_path: Path) -> None:
    """The first-hour report: a copy of Python's stdlib failed at once on one dangling symlink."""
    import json as json_pkg

    copy = tmp_path / "stdlib"
    shutil.copytree(Path(json_pkg.__file__).parent, copy, symlinks=True)
    (copy / "broken_link.py").symlink_to(copy / "gone.py")
    staged = stage_context(tmp_path / "ctx.txt", paths=[str(copy)])
    assert f"{copy}/decoder.py" in staged_names(staged)
    assert skip_reasons(staged) == {f"{copy}/broken_link.py": "dangling link"}
