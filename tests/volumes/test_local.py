import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_rlm.volumes import DURABLE_ROOTS, LocalVolumes, VolumeError, parse_volume_ref, volume_uri

WRITE_ROOTS = ("memory", "artifacts")


def test_ensure_creates_durable_roots(vols: LocalVolumes) -> None:
    path = vols.ensure("notes")
    assert path == vols.root / "notes" == vols.path("notes")
    assert sorted(p.name for p in path.iterdir()) == sorted(DURABLE_ROOTS)
    assert vols.ensure("notes") == path  # idempotent
    assert [e["path"] for e in vols.list_files("notes")] == sorted(DURABLE_ROOTS)
    assert all(e["type"] == "dir" for e in vols.list_files("notes"))


@pytest.mark.parametrize("name", ["", ".", "..", "-x", "a/b", "a b", "x" * 65, "_x", "é"])
def test_bad_volume_names(vols: LocalVolumes, name: str) -> None:
    with pytest.raises(VolumeError, match="invalid volume name"):
        vols.ensure(name)


def test_missing_volume(vols: LocalVolumes) -> None:
    with pytest.raises(VolumeError, match="no volume 'ghost'"):
        vols.read("ghost", "memory/a")
    with pytest.raises(VolumeError, match="no volume"):
        vols.path("ghost")


def test_write_read_list(vols: LocalVolumes) -> None:
    entry = vols.write("notes", "memory/sub/a.md", "hello wörld")
    assert entry["path"] == "memory/sub/a.md" and entry["type"] == "file"
    assert entry["size"] == len("hello wörld".encode())
    assert vols.read_text("notes", "memory/sub/a.md") == "hello wörld"
    vols.write("notes", "artifacts/b.bin", b"\x00\x01\x02\x03\x04")
    assert vols.read("notes", "artifacts/b.bin", offset=1, length=3) == b"\x01\x02\x03"
    assert vols.read("notes", "artifacts/b.bin", offset=3) == b"\x03\x04"
    assert vols.read("notes", "artifacts/b.bin", offset=99) == b""
    assert vols.read("notes", "./artifacts//b.bin") == b"\x00\x01\x02\x03\x04"  # normalised
    with pytest.raises(VolumeError, match="negative"):
        vols.read("notes", "artifacts/b.bin", offset=-1)

    assert [e["path"] for e in vols.list_files("notes", "memory")] == ["memory/sub"]
    rec = vols.list_files("notes", recursive=True)
    assert [e["path"] for e in rec if e["type"] == "file"] == ["artifacts/b.bin", "memory/sub/a.md"]
    assert {e["path"]: e["size"] for e in rec}["artifacts/b.bin"] == 5

    vols.write("notes", "memory/sub/a.md", "v2")  # overwrite
    assert vols.read_text("notes", "memory/sub/a.md") == "v2"
    assert vols.list_volumes() == [{"name": "notes", "files": 2, "bytes": 7}]


def test_missing_file_and_folder_errors(vols: LocalVolumes) -> None:
    vols.ensure("notes")
    with pytest.raises(VolumeError, match="no file 'memory/x' in volume 'notes'"):
        vols.read("notes", "memory/x")
    with pytest.raises(VolumeError, match="is a folder"):
        vols.read("notes", "memory")
    with pytest.raises(VolumeError, match="no folder"):
        vols.list_files("notes", "nope")
    vols.write("notes", "memory/f", "x")
    with pytest.raises(VolumeError, match="is a file"):
        vols.list_files("notes", "memory/f")
    with pytest.raises(VolumeError, match="is a folder"):
        vols.write("notes", "memory", "x")


def test_write_restricted_to_roots(vols: LocalVolumes) -> None:
    vols.write("notes", "memory/a.md", "ok", roots=WRITE_ROOTS)
    vols.write("notes", "artifacts/x/y.txt", "ok", roots=WRITE_ROOTS)
    for bad in ("buffers/a", "meta/a", "a.md", "memory", "memoryx/a", ""):
        with pytest.raises(VolumeError):
            vols.write("notes", bad, "no", roots=WRITE_ROOTS)
    assert not (vols.path("notes") / "buffers" / "a").exists()
    vols.write("notes", "buffers/a", "fine without roots")


def test_write_roots_checked_after_symlinks(vols: LocalVolumes) -> None:
    vol = vols.ensure("notes")
    (vol / "memory" / "sneaky").symlink_to(vol / "meta", target_is_directory=True)
    with pytest.raises(VolumeError, match="outside"):
        vols.write("notes", "memory/sneaky/x", "no", roots=WRITE_ROOTS)
    assert not (vol / "meta" / "x").exists()


@pytest.mark.parametrize(
    "path",
    ["../x", "memory/../../x", "..", "/etc/passwd", "\\etc", "C:\\x", "memory/a\x00b", "a/./../../b"],
)
def test_traversal_refused(vols: LocalVolumes, path: str) -> None:
    vols.ensure("notes")
    for op in (
        lambda: vols.read("notes", path),
        lambda: vols.write("notes", path, "x"),
        lambda: vols.delete("notes", path),
        lambda: vols.list_files("notes", path),
    ):
        with pytest.raises(VolumeError):
            op()


def test_escape_message(vols: LocalVolumes) -> None:
    vols.ensure("notes")
    with pytest.raises(VolumeError, match=r"path '\.\./x' escapes volume 'notes'"):
        vols.read("notes", "../x")


def test_symlinks_outside_refused(vols: LocalVolumes, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    vol = vols.ensure("notes")
    (vol / "memory" / "link").symlink_to(outside, target_is_directory=True)
    (vol / "memory" / "file_link").symlink_to(outside / "secret.txt")
    for path in ("memory/link/secret.txt", "memory/file_link"):
        with pytest.raises(VolumeError, match="escapes"):
            vols.read("notes", path)
        with pytest.raises(VolumeError, match="escapes"):
            vols.write("notes", path, "pwned")
    with pytest.raises(VolumeError, match="escapes"):
        vols.list_files("notes", "memory/link")
    assert (outside / "secret.txt").read_text() == "secret"
    # Listing hides links pointing outside; deleting a link removes only the link.
    assert vols.list_files("notes", "memory") == []
    vols.delete("notes", "memory/link")
    vols.delete("notes", "memory/file_link")
    assert (outside / "secret.txt").read_text() == "secret"


def test_symlink_inside_volume_is_fine(vols: LocalVolumes) -> None:
    vol = vols.ensure("notes")
    vols.write("notes", "memory/real.md", "hi")
    (vol / "artifacts" / "alias.md").symlink_to(vol / "memory" / "real.md")
    assert vols.read_text("notes", "artifacts/alias.md") == "hi"


def test_delete(vols: LocalVolumes) -> None:
    vols.write("notes", "memory/d/a.md", "x")
    with pytest.raises(VolumeError, match="not empty"):
        vols.delete("notes", "memory/d")
    vols.delete("notes", "memory/d/a.md")
    vols.delete("notes", "memory/d")
    assert vols.list_files("notes", "memory") == []
    with pytest.raises(VolumeError, match="no file 'memory/d' in volume 'notes'"):
        vols.delete("notes", "memory/d")
    for root in ("", ".", "/", *DURABLE_ROOTS, "memory/"):
        with pytest.raises(VolumeError):
            vols.delete("notes", root)
    assert all((vols.path("notes") / r).is_dir() for r in DURABLE_ROOTS)


def test_delete_durable_root_via_symlink_refused(vols: LocalVolumes) -> None:
    vol = vols.ensure("notes")
    (vol / "artifacts" / "up").symlink_to(vol, target_is_directory=True)
    with pytest.raises(VolumeError, match="durable"):
        vols.delete("notes", "artifacts/up/buffers")
    assert (vol / "buffers").is_dir()


def test_delete_volume_and_list(vols: LocalVolumes, tmp_path: Path) -> None:
    assert vols.list_volumes() == []
    vols.ensure("a")
    vols.write("b", "memory/x", "12345")
    outside = tmp_path / "keep.txt"
    outside.write_text("keep")
    os.symlink(outside, vols.path("b") / "memory" / "l")
    assert vols.list_volumes() == [
        {"name": "a", "files": 0, "bytes": 0},
        {"name": "b", "files": 1, "bytes": 5},
    ]
    vols.delete_volume("b")
    assert [v["name"] for v in vols.list_volumes()] == ["a"]
    assert outside.read_text() == "keep"
    with pytest.raises(VolumeError, match="no volume"):
        vols.delete_volume("b")


def test_parse_volume_ref() -> None:
    assert parse_volume_ref("vol:notes/memory/a.md") == ("notes", "memory/a.md")
    assert parse_volume_ref("volume://notes/memory/a.md") == ("notes", "memory/a.md")
    assert parse_volume_ref("vol://notes/x") == ("notes", "x")
    assert parse_volume_ref("vol:notes") == ("notes", "")
    assert parse_volume_ref("vol:notes/") == ("notes", "")
    for bad in ("notes/memory", "vol:", "vol:/x", "vol:-bad/x", "http://x/y", "volume:/x"):
        assert parse_volume_ref(bad) is None
    assert parse_volume_ref(volume_uri("notes", "memory/a.md")) == ("notes", "memory/a.md")
    assert volume_uri("notes") == "vol:notes"


_segments = st.sampled_from(["..", ".", "", "memory", "a", "..\\..", "/", "\x00", "~", "b.md"]) | st.text(
    max_size=6
)
_paths = st.lists(_segments, max_size=6).map("/".join) | st.text(max_size=20)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=_paths, data=st.binary(max_size=8))
def test_random_paths_never_leave_the_volume(tmp_path: Path, path: str, data: bytes) -> None:
    vols = LocalVolumes(tmp_path / "volumes")
    vol = vols.ensure("v").resolve()
    outside = tmp_path.resolve()
    (vol / "memory" / "out").unlink(missing_ok=True)
    (vol / "memory" / "out").symlink_to(outside, target_is_directory=True)
    before = {p for p in outside.rglob("*") if not p.is_relative_to(vol)}
    try:
        entry = vols.write("v", path, data)
    except (VolumeError, OSError):
        pass
    else:
        written = (vol / entry["path"]).resolve()
        assert written.is_relative_to(vol)
        assert vols.read("v", entry["path"]) == data
    try:
        resolved, _ = vols._resolve("v", path)
    except VolumeError:
        pass
    else:
        assert resolved.is_relative_to(vol)
    after = {p for p in outside.rglob("*") if not p.is_relative_to(vol)}
    assert after == before, "something was created outside the volume"
