"""LocalVolumes: the file API over volume folders (fd-relative, links refused) and its quotas."""

import contextlib
import os
import stat
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from fleet_rlm.volumes import DURABLE_ROOTS, LocalVolumes, VolumeError, parse_volume_ref, volume_uri

WRITE_ROOTS = ("memory", "artifacts")
MB = 1024 * 1024


def mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


def test_ensure_creates_durable_roots(vols: LocalVolumes) -> None:
    path = vols.ensure("notes")
    assert path == vols.root / "notes" == vols.path("notes")
    assert sorted(p.name for p in path.iterdir()) == sorted(DURABLE_ROOTS)
    assert vols.ensure("notes") == path  # idempotent
    assert [e["path"] for e in vols.list_files("notes")] == sorted(DURABLE_ROOTS)
    assert all(e["type"] == "dir" for e in vols.list_files("notes"))
    assert mode(path) == 0o700 and all(mode(path / r) == 0o700 for r in DURABLE_ROOTS)


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
    assert mode(vols.root / "notes/memory/sub/a.md") == 0o600 and mode(vols.root / "notes/memory/sub") == 0o700
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
    assert vols.stat("notes", "memory/sub/a.md")["size"] == len("hello wörld".encode())

    vols.write("notes", "memory/sub/a.md", "v2")  # overwrite
    assert vols.read_text("notes", "memory/sub/a.md") == "v2"
    assert [p.name for p in (vols.root / "notes/memory/sub").iterdir()] == ["a.md"]  # no temp file left
    # Entries count files, folders and links alike (memory/sub is one).
    assert vols.list_volumes() == [
        {"name": "notes", "files": 3, "bytes": 7, "quota_bytes": 1024 * MB, "max_files": 100_000}
    ]


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
    with pytest.raises(VolumeError, match="is a file, not a folder"):
        vols.write("notes", "memory/f/below", "x")


def test_write_restricted_to_roots(vols: LocalVolumes) -> None:
    vols.write("notes", "memory/a.md", "ok", roots=WRITE_ROOTS)
    vols.write("notes", "artifacts/x/y.txt", "ok", roots=WRITE_ROOTS)
    for bad in ("buffers/a", "meta/a", "a.md", "memory", "memoryx/a", ""):
        with pytest.raises(VolumeError):
            vols.write("notes", bad, "no", roots=WRITE_ROOTS)
    assert not (vols.path("notes") / "buffers" / "a").exists()
    vols.write("notes", "buffers/a", "fine without roots")


def test_link_to_another_root_is_refused(vols: LocalVolumes) -> None:
    vol = vols.ensure("notes")
    (vol / "memory" / "sneaky").symlink_to(vol / "meta", target_is_directory=True)
    with pytest.raises(VolumeError, match="'memory/sneaky' in volume 'notes' is a symbolic link"):
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
        lambda: vols.stat("notes", path),
    ):
        with pytest.raises(VolumeError):
            op()


def test_escape_message(vols: LocalVolumes) -> None:
    vols.ensure("notes")
    with pytest.raises(VolumeError, match=r"path '\.\./x' escapes volume 'notes'"):
        vols.read("notes", "../x")


def test_links_are_listed_never_followed(vols: LocalVolumes, tmp_path: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("secret")
    vol = vols.ensure("notes")
    (vol / "memory" / "link").symlink_to(outside, target_is_directory=True)
    (vol / "memory" / "file_link").symlink_to(outside / "secret.txt")
    for path in ("memory/link/secret.txt", "memory/file_link"):
        with pytest.raises(VolumeError, match="symbolic link"):
            vols.read("notes", path)
    with pytest.raises(VolumeError, match="symbolic link"):
        vols.write("notes", "memory/link/secret.txt", "pwned")
    with pytest.raises(VolumeError, match="symbolic link"):
        vols.list_files("notes", "memory/link")
    assert (outside / "secret.txt").read_text() == "secret"
    listing = {e["path"]: e for e in vols.list_files("notes", "memory", recursive=True)}
    assert {p: e["type"] for p, e in listing.items()} == {"memory/file_link": "link", "memory/link": "link"}
    assert all(e["size"] == 0 for e in listing.values())
    assert vols.stat("notes", "memory/file_link")["type"] == "link"
    with pytest.raises(VolumeError, match="'memory/file_link' in volume 'notes' is a symbolic link"):
        vols.write("notes", "memory/file_link", "mine")
    vols.delete("notes", "memory/file_link")  # removes the link only
    vols.delete("notes", "memory/link")
    assert (outside / "secret.txt").read_text() == "secret" and not (vol / "memory" / "link").exists()


def test_links_pointing_inside_are_refused_too(vols: LocalVolumes) -> None:
    vol = vols.ensure("notes")
    vols.write("notes", "memory/real.md", "hi")
    (vol / "artifacts" / "alias.md").symlink_to(vol / "memory" / "real.md")
    (vol / "artifacts" / "up").symlink_to(vol, target_is_directory=True)
    with pytest.raises(VolumeError, match="never followed"):
        vols.read("notes", "artifacts/alias.md")
    with pytest.raises(VolumeError, match="symbolic link"):
        vols.delete("notes", "artifacts/up/buffers")
    assert (vol / "buffers").is_dir()


def test_special_files_are_refused_without_blocking(vols: LocalVolumes) -> None:
    vol = vols.ensure("notes")
    os.mkfifo(vol / "memory" / "pipe")
    with pytest.raises(VolumeError, match="'memory/pipe' in volume 'notes' is a named pipe"):
        vols.read("notes", "memory/pipe")  # O_NONBLOCK: refused at once, never waits for a writer
    assert vols.stat("notes", "memory/pipe")["type"] == "other"
    assert [e["type"] for e in vols.list_files("notes", "memory")] == ["other"]
    vols.delete("notes", "memory/pipe")
    assert not (vol / "memory" / "pipe").exists()


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


def test_delete_volume_and_list(vols: LocalVolumes, tmp_path: Path) -> None:
    assert vols.list_volumes() == []
    vols.ensure("a")
    vols.write("b", "memory/x", "12345")
    outside = tmp_path / "keep.txt"
    outside.write_text("keep")
    os.symlink(outside, vols.path("b") / "memory" / "l")
    assert [(v["name"], v["files"], v["bytes"]) for v in vols.list_volumes()] == [("a", 0, 0), ("b", 2, 5)]
    vols.delete_volume("b")
    assert [v["name"] for v in vols.list_volumes()] == ["a"]
    assert outside.read_text() == "keep"
    with pytest.raises(VolumeError, match="no volume"):
        vols.delete_volume("b")


def test_a_volume_folder_that_is_a_link_is_never_used(vols: LocalVolumes, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere"
    (target / "memory").mkdir(parents=True)
    (target / "memory" / "keep.txt").write_text("keep")
    vols.ensure("real")
    (vols.root / "evil").symlink_to(target, target_is_directory=True)
    assert [v["name"] for v in vols.list_volumes()] == ["real"]
    for op in (
        lambda: vols.path("evil"),
        lambda: vols.read("evil", "memory/keep.txt"),
        lambda: vols.write("evil", "memory/new.txt", "x"),
        lambda: vols.delete_volume("evil"),
    ):
        with pytest.raises(VolumeError, match=r"symbolic link|not a folder"):
            op()
    assert sorted(p.name for p in (target / "memory").iterdir()) == ["keep.txt"]


# -- quotas ---------------------------------------------------------------------------------------


def test_host_writes_over_quota_are_refused(tmp_path: Path) -> None:
    vols = LocalVolumes(tmp_path / "volumes", quota_mb=1, max_files=4)
    vols.write("q", "memory/a.bin", b"x" * (MB // 2))
    vols.write("q", "memory/a.bin", b"x" * (MB - 10))  # replacing a file counts only the difference
    with pytest.raises(VolumeError, match=r"would be over quota.*FLEET_VOLUME_QUOTA_MB"):
        vols.write("q", "memory/b.bin", b"x" * 100)
    assert not (vols.root / "q/memory/b.bin").exists()
    vols.write("q", "memory/a.bin", b"small")
    vols.write("q", "memory/d/e.txt", b"1")  # a folder and a file: 3 entries
    with pytest.raises(VolumeError, match=r"entries.*FLEET_VOLUME_MAX_FILES"):
        vols.write("q", "memory/f/g.txt", b"1")
    assert not (vols.root / "q/memory/f").exists()


def test_enforce_quota_removes_only_the_steps_excess(tmp_path: Path) -> None:
    vols = LocalVolumes(tmp_path / "volumes", quota_mb=1)
    vol = vols.ensure("q")
    (vol / "memory" / "old.bin").write_bytes(b"o" * (MB // 2))
    since = time.time()
    assert vols.enforce_quota("q", since) is None  # within quota: nothing to do
    time.sleep(0.1)  # lets the old file's ctime fall before the step's start even on a coarse clock
    since = time.time()
    (vol / "artifacts" / "first.bin").write_bytes(b"f" * (MB // 4))
    (vol / "artifacts" / "second.bin").write_bytes(b"s" * (MB // 2))
    os.utime(vol / "artifacts" / "second.bin", (1, 1))  # a backdated mtime does not hide it: ctime is now
    message = vols.enforce_quota("q", since)
    assert message is not None
    assert "volume q is over quota" in message and "FLEET_VOLUME_QUOTA_MB" in message
    assert "removed 1 entry" in message and "artifacts/second.bin" in message
    assert (vol / "memory" / "old.bin").exists() and (vol / "artifacts" / "first.bin").exists()
    assert not (vol / "artifacts" / "second.bin").exists()
    assert vols.usage("q").bytes <= MB
    assert vols.enforce_quota("q", since) is None


def test_enforce_quota_never_removes_older_data(tmp_path: Path) -> None:
    vol = LocalVolumes(tmp_path / "volumes").ensure("q")
    (vol / "memory" / "old.bin").write_bytes(b"o" * (2 * MB))
    time.sleep(0.1)
    since = time.time()
    (vol / "memory" / "new.bin").write_bytes(b"n" * 10)
    (vol / "memory" / "newdir").mkdir()
    lowered = LocalVolumes(tmp_path / "volumes", quota_mb=1)  # the limit was lowered below the old data
    message = lowered.enforce_quota("q", since)
    assert message is not None and "Still over" in message and "older data is never removed" in message
    assert (vol / "memory" / "old.bin").stat().st_size == 2 * MB
    assert not (vol / "memory" / "new.bin").exists() and not (vol / "memory" / "newdir").exists()


def test_enforce_quota_counts_entries(tmp_path: Path) -> None:
    vols = LocalVolumes(tmp_path / "volumes", max_files=10)
    vol = vols.ensure("q")
    since = time.time()
    for i in range(30):
        (vol / "buffers" / f"d{i}").mkdir()
    (vol / "buffers" / "d0" / "x").write_text("x")
    message = vols.enforce_quota("q", since)
    assert message is not None and "FLEET_VOLUME_MAX_FILES" in message
    assert vols.usage("q").files == 10


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


_segments = st.sampled_from(["..", ".", "", "memory", "a", "..\\..", "/", "\x00", "~", "b.md", "out"]) | st.text(
    max_size=6
)
_paths = st.lists(_segments, max_size=6).map("/".join) | st.text(max_size=20)


@pytest.mark.slow
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
        written = vol / entry["path"]
        assert not written.is_symlink() and written.resolve().is_relative_to(vol)
        assert vols.read("v", entry["path"]) == data
    for op in (vols.read, vols.delete, vols.list_files):
        with contextlib.suppress(VolumeError, OSError):
            op("v", path)
    after = {p for p in outside.rglob("*") if not p.is_relative_to(vol)}
    assert after == before, "something was created or removed outside the volume"
    (vol / "memory" / "out").unlink(missing_ok=True)


def test_a_new_file_write_never_follows_or_replaces_a_link_and_leaves_no_temp_file(
    vols: LocalVolumes, tmp_path: Path
) -> None:
    from fleet_rlm.volumes.base import Expect
    from fleet_rlm.volumes.safepath import VolumeChanged

    vol = vols.ensure("notes")
    (vol / "memory" / "dangling.md").symlink_to(tmp_path / "outside.md")  # points at nothing yet
    with pytest.raises(VolumeError):
        vols.write("notes", "memory/dangling.md", "x", expect=Expect(None))
    assert not (tmp_path / "outside.md").exists() and (vol / "memory" / "dangling.md").is_symlink()
    vols.write("notes", "memory/a.md", "one", expect=Expect(None))
    with pytest.raises(VolumeChanged):
        vols.write("notes", "memory/a.md", "two", expect=Expect(None))
    assert sorted(p.name for p in (vol / "memory").iterdir()) == ["a.md", "dangling.md"]  # no temp file left
    assert mode(vol / "memory" / "a.md") == 0o600
