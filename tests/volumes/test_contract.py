"""The volumes contract: what every volume store must do, run against each registered one.

"local" is folders on this host; "daytona" is Daytona volumes through the loopback Daytona API double
(tests/support/daytona_api.py) driven by the real SDK. A new store adds its name to STORES and must
pass unchanged. Where Daytona differs by design, the test asserts each store's own behaviour and says
why (never a silent skip). What reached the disk is checked on the host: the volumes folder, or the
folder where the double keeps its volumes.
"""

from __future__ import annotations

import hashlib
import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm import errors
from fleet_rlm.config import Settings
from fleet_rlm.volumes import DURABLE_ROOTS, volumes_for
from fleet_rlm.volumes.base import Expect
from fleet_rlm.volumes.safepath import VolumeChanged, VolumeError, VolumeNotFound

STORES = ["local", "daytona"]
REFUSED_PATHS = ["../x", "memory/../../x", "..", "/etc/passwd", "\\etc", "C:\\x", "memory/a\x00b"]


@dataclass
class Store:
    kind: str
    volumes: Any
    on_host: Callable[[], set[Path]]  # every file and folder the store keeps on the host, volumes included

    @property
    def daytona(self) -> bool:
        return self.kind == "daytona"


def _tree(root: Path) -> Callable[[], set[Path]]:
    return lambda: {p.relative_to(root) for p in root.rglob("*")} if root.exists() else set()


def _settings(kind: str, tmp_path: Path, request: pytest.FixtureRequest, **fields: Any) -> Settings:
    if kind == "daytona":
        double = request.getfixturevalue("daytona_double")
        fields |= {"daytona_api_url": double.api_url, "daytona_api_key": "test-key"}
        # The double lives for the session: a prefix of this test's own keeps other tests' volumes out of sight.
        fields.setdefault("daytona_volume_prefix", f"t{uuid.uuid4().hex[:8]}-")
    return Settings(sandbox=kind, home=tmp_path / "home", **fields)


@pytest.fixture
def make_store(request: pytest.FixtureRequest, tmp_path: Path) -> Callable[..., Store]:
    kind = request.param

    def make(**fields: Any) -> Store:
        settings = _settings(kind, tmp_path, request, **fields)
        if kind == "daytona":
            on_host = _tree(request.getfixturevalue("daytona_double").data / "volumes")
        else:
            on_host = _tree(settings.volumes_root)
        return Store(kind, volumes_for(settings), on_host)

    return make


@pytest.fixture
def store(make_store: Callable[..., Store]) -> Store:
    return make_store()


pytestmark = pytest.mark.parametrize(("make_store"), STORES, indirect=True)


def test_ensure_makes_a_volume_with_its_durable_roots(store: Store) -> None:
    vols = store.volumes
    assert vols.names() == []
    where = vols.ensure("notes")
    assert vols.ensure("notes") == where == vols.path("notes")  # idempotent; path says where it is mounted
    assert vols.names() == ["notes"]
    listed = vols.list_files("notes")
    assert [e["path"] for e in listed] == sorted(DURABLE_ROOTS) and {e["type"] for e in listed} == {"dir"}
    assert (vols.usage("notes").files, vols.usage("notes").bytes) == (0, 0)  # the durable roots are not counted


def test_write_and_read_back_bytes_and_text(store: Store) -> None:
    vols = store.volumes
    entry = vols.write("notes", "memory/sub/a.md", "hello wörld")  # creates the volume and the folders
    assert (entry["path"], entry["type"], entry["size"]) == ("memory/sub/a.md", "file", len("hello wörld".encode()))
    assert vols.read_text("notes", "memory/sub/a.md") == "hello wörld"
    vols.write("notes", "artifacts/b.bin", b"\x00\x01\x02\x03\x04")
    assert vols.read("notes", "artifacts/b.bin") == b"\x00\x01\x02\x03\x04"
    assert vols.read("notes", "artifacts/b.bin", offset=1, length=3) == b"\x01\x02\x03"
    assert vols.read("notes", "artifacts/b.bin", offset=3) == b"\x03\x04"
    assert vols.read("notes", "artifacts/b.bin", offset=99) == b""
    assert vols.read("notes", "./artifacts//b.bin") == b"\x00\x01\x02\x03\x04"  # the path is normalised
    assert vols.read_text("notes", "memory/sub/a.md", offset=6, length=3) == "wö"
    with pytest.raises(VolumeError, match="negative"):
        vols.read("notes", "artifacts/b.bin", offset=-1)
    vols.write("notes", "memory/sub/a.md", "v2")  # a whole file replaced
    assert vols.read_text("notes", "memory/sub/a.md") == "v2"


def test_a_conditional_write_writes_only_over_the_file_it_expects(store: Store) -> None:
    # What an approval card showed: no file (a new file), or a file with this content. Anything else
    # there when the write happens is refused, and the file is left as it is.
    vols, new = store.volumes, Expect(sha256=None)
    vols.write("notes", "memory/a.md", "first", expect=new)
    with pytest.raises(VolumeChanged, match="changed"):
        vols.write("notes", "memory/a.md", "second", expect=new)
    assert vols.read("notes", "memory/a.md") == b"first"
    first = Expect(hashlib.sha256(b"first").hexdigest())
    vols.write("notes", "memory/a.md", "third", expect=first)
    with pytest.raises(VolumeChanged, match="changed"):
        vols.write("notes", "memory/a.md", "fourth", expect=first)  # it holds "third" now
    assert vols.read("notes", "memory/a.md") == b"third"
    with pytest.raises(VolumeChanged, match="changed"):
        vols.write("notes", "memory/b.md", "x", expect=first)  # expected a file where there is none
    with pytest.raises(VolumeError):
        vols.write("notes", "memory", "x", expect=new)  # a folder is something too
    assert sorted(e["path"] for e in vols.list_files("notes", "memory")) == ["memory/a.md"]
    assert issubclass(VolumeChanged, errors.Conflict)


def test_open_file_gives_an_fd_of_the_file(store: Store) -> None:
    # Daytona has no host file to open: its open_file hands over an fd of a host-private copy (the
    # same contract: an fd the caller reads and closes, with its fstat).
    store.volumes.write("notes", "artifacts/r.txt", "report")
    fd, info = store.volumes.open_file("notes", "artifacts/r.txt")
    with os.fdopen(fd, "rb") as f:
        assert f.read() == b"report" and info.st_size == 6


def test_writes_stay_under_the_roots_given(store: Store) -> None:
    vols = store.volumes
    vols.write("notes", "memory/a.md", "ok", roots=("memory",))
    for bad in ("buffers/a", "a.md", "memory", "memoryx/a", ""):
        with pytest.raises(VolumeError):
            vols.write("notes", bad, "no", roots=("memory",))
    assert [e["path"] for e in vols.list_files("notes", recursive=True) if e["type"] == "file"] == ["memory/a.md"]


def test_list_files_recursive_and_not(store: Store) -> None:
    vols = store.volumes
    vols.write("notes", "memory/sub/a.md", "abc")
    vols.write("notes", "artifacts/b.bin", b"12345")
    assert [(e["path"], e["type"], e["size"]) for e in vols.list_files("notes", "memory")] == [("memory/sub", "dir", 0)]
    everything = vols.list_files("notes", recursive=True)
    assert [e["path"] for e in everything] == sorted(
        ["artifacts", "artifacts/b.bin", "buffers", "memory", "memory/sub", "memory/sub/a.md", "meta"]
    )
    assert {e["path"]: e["size"] for e in everything if e["type"] == "file"} == {
        "artifacts/b.bin": 5, "memory/sub/a.md": 3,
    }  # fmt: skip
    assert all(isinstance(e["mtime"], float) for e in everything)
    with pytest.raises(VolumeError) as not_a_folder:
        vols.list_files("notes", "memory/sub/a.md")
    assert not isinstance(not_a_folder.value, VolumeNotFound)  # it exists: the wrong kind, not missing
    with pytest.raises(VolumeNotFound):
        vols.list_files("notes", "nope")


def test_stat(store: Store) -> None:
    vols = store.volumes
    vols.write("notes", "memory/a.md", "abcd")
    entry = vols.stat("notes", "memory/a.md")
    assert (entry["path"], entry["type"], entry["size"]) == ("memory/a.md", "file", 4)
    assert (vols.stat("notes", "memory")["type"], vols.stat("notes", "memory")["size"]) == ("dir", 0)
    assert (vols.stat("notes", "")["path"], vols.stat("notes", "")["type"]) == ("", "dir")  # the volume itself
    with pytest.raises(VolumeNotFound, match=r"memory/b\.md"):
        vols.stat("notes", "memory/b.md")


def test_delete_files_and_empty_folders_only(store: Store) -> None:
    vols = store.volumes
    vols.write("notes", "memory/d/a.md", "x")
    with pytest.raises(VolumeError) as not_empty:
        vols.delete("notes", "memory/d")
    assert not isinstance(not_empty.value, VolumeNotFound)
    vols.delete("notes", "memory/d/a.md")
    vols.delete("notes", "memory/d")
    assert vols.list_files("notes", "memory") == []
    with pytest.raises(VolumeNotFound):
        vols.delete("notes", "memory/d")
    for root in ("", ".", "/", *DURABLE_ROOTS, "memory/"):  # the volume and its durable roots stay
        with pytest.raises(VolumeError):
            vols.delete("notes", root)
    assert [e["path"] for e in vols.list_files("notes")] == sorted(DURABLE_ROOTS)


def test_delete_volume(store: Store) -> None:
    vols = store.volumes
    vols.write("keep", "memory/k", "keep")
    vols.write("gone", "memory/x", "12345")
    vols.delete_volume("gone")
    assert vols.names() == ["keep"] and vols.read_text("keep", "memory/k") == "keep"
    with pytest.raises(VolumeNotFound):
        vols.delete_volume("gone")
    with pytest.raises(VolumeNotFound):
        vols.read("gone", "memory/x")


def test_names_and_list_volumes(make_store: Callable[..., Store]) -> None:
    vols = make_store(volume_quota_mb=3, volume_max_files=50).volumes
    assert vols.list_volumes() == []
    vols.write("b", "memory/x", "12345")
    vols.ensure("a")
    assert vols.names() == ["a", "b"]
    # ``files`` counts every entry but the durable roots (memory/x is one), ``bytes`` the files' sizes.
    assert vols.list_volumes() == [
        {"name": "a", "files": 0, "bytes": 0, "quota_bytes": 3 * 1024 * 1024, "max_files": 50},
        {"name": "b", "files": 1, "bytes": 5, "quota_bytes": 3 * 1024 * 1024, "max_files": 50},
    ]


def test_anything_missing_is_volume_not_found_a_not_found(store: Store) -> None:
    vols = store.volumes
    vols.ensure("notes")
    missing: list[Callable[[], object]] = [
        lambda: vols.read("ghost", "memory/a"),
        lambda: vols.stat("ghost", ""),
        lambda: vols.list_files("ghost"),
        lambda: vols.usage("ghost"),
        lambda: vols.delete_volume("ghost"),
        lambda: vols.read("notes", "memory/a"),
        lambda: vols.read_text("notes", "memory/a"),
        lambda: vols.open_file("notes", "memory/a"),
        lambda: vols.delete("notes", "memory/a"),
    ]
    for call in missing:
        with pytest.raises(VolumeNotFound) as caught:
            call()
        assert isinstance(caught.value, errors.NotFound)  # every face maps it to "not found" (404, exit code)


@pytest.mark.parametrize("path", REFUSED_PATHS)
def test_a_path_outside_the_volume_is_refused_and_nothing_reaches_the_disk(store: Store, path: str) -> None:
    vols = store.volumes
    vols.ensure("notes")
    before = store.on_host()
    for call in (
        lambda: vols.write("notes", path, "escaped"),
        lambda: vols.read("notes", path),
        lambda: vols.stat("notes", path),
        lambda: vols.list_files("notes", path),
        lambda: vols.delete("notes", path),
    ):
        with pytest.raises(VolumeError) as caught:
            call()
        assert not isinstance(caught.value, VolumeNotFound)  # refused, not looked for
    assert store.on_host() == before


@pytest.mark.parametrize("name", ["", "..", "-x", "a/b", "x" * 65, "é"])
def test_invalid_volume_names_are_refused(store: Store, name: str) -> None:
    with pytest.raises(VolumeError, match="invalid volume name"):
        store.volumes.check_name(name)
    with pytest.raises(VolumeError, match="invalid volume name"):
        store.volumes.ensure(name)
    assert store.volumes.names() == []


def test_quota_is_checked_on_write_by_local_volumes_only(make_store: Callable[..., Store]) -> None:
    store = make_store(volume_quota_mb=1)
    vols = store.volumes
    big = b"x" * (1024 * 1024 + 1)
    if store.daytona:
        # Daytona's own storage limits apply to its volumes: the host neither measures a write nor
        # trims after a step (volumes/daytona.py), so an oversized write goes through.
        assert vols.write("notes", "artifacts/big", big)["size"] == len(big)
        assert vols.enforce_quota("notes", since=0.0) is None
        return
    with pytest.raises(VolumeError, match="refused"):
        vols.write("notes", "artifacts/big", big)
    assert vols.enforce_quota("notes", since=0.0) is None  # within its quota: nothing to say


def test_path_of_a_missing_volume(store: Store) -> None:
    if store.daytona:
        # Daytona's path is where sandboxes mount the volume, not a host folder; answering it costs no
        # round trip, so it does not look whether the volume exists (the mount does).
        assert store.volumes.path("ghost").name == "ghost"
        return
    with pytest.raises(VolumeNotFound):
        store.volumes.path("ghost")
