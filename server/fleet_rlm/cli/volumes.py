"""``volumes ls|cat|put|rm``: targets are VOLUME or VOLUME/PATH (``vol:`` in front is accepted).

The calls are the workspace's (``core.volume_operations``), made on the settings' volume store alone:
no engine and no run store, so the command starts instantly."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from fleet_rlm.cli.common import plural, print_json
from fleet_rlm.errors import NotFound, UserError

if TYPE_CHECKING:
    from fleet_rlm.core.volume_operations import VolumeOperations

LIST_HINT = "`fleet-rlm volumes ls` lists the volumes"


def _split(target: str, *, need_path: str | None = None) -> tuple[str, str]:
    """(volume, path); ``need_path`` is the usage line to show when the path is missing."""
    name, _, path = target.removeprefix("vol:").removeprefix("//").partition("/")
    if not name:
        raise UserError(f"'{target}': expected VOLUME or VOLUME/PATH")
    if need_path and not path.strip("/"):
        raise UserError(f"'{target}' names a whole volume: {need_path}")
    return name, path


def _read_source(source: str) -> bytes:
    if source == "-":
        return sys.stdin.buffer.read()
    try:
        return Path(source).expanduser().read_bytes()
    except IsADirectoryError:
        raise UserError(f"'{source}' is a folder: put copies one file (repeat it per file)") from None
    except FileNotFoundError:
        raise UserError(f"no file '{source}': give an existing local file, or - for stdin") from None
    except OSError as exc:  # permission denied, a name too long for the file system, ...
        raise UserError(f"cannot read '{source}': {exc.strerror}") from None


def cmd_volumes(args: argparse.Namespace) -> int:
    from fleet_rlm.config import load_settings
    from fleet_rlm.core.volume_operations import VolumeOperations
    from fleet_rlm.volumes import volumes_for

    settings = load_settings(secrets=False)  # local volumes need no key: the keyring stays unasked
    if settings.sandbox != "local":
        settings = load_settings()
    volumes = volumes_for(settings)
    try:
        return _act(VolumeOperations(lambda: volumes), args)
    except NotFound as exc:  # name the command that shows what exists
        raise NotFound(f"{exc.message}: {LIST_HINT}") from None


def _act(volumes: VolumeOperations, args: argparse.Namespace) -> int:
    if args.action == "ls":
        return _ls(volumes, args)
    if args.action == "cat":
        name, path = _split(args.target, need_path="give a file: fleet-rlm volumes cat VOLUME/PATH")
        sys.stdout.buffer.write(volumes.file_bytes(name, path))
        return 0
    if args.action == "put":
        name, path = _split(args.target, need_path="give where to write: fleet-rlm volumes put FILE VOLUME/PATH")
        data = _read_source(args.source)
        volumes.write_file(name, path, data)  # creates the volume; refuses links and writes over quota
        print(f"wrote {len(data):,} bytes to {name}/{path}")
        return 0
    if args.all:
        name, path = _split(args.target)
        if path.strip("/"):
            raise UserError(f"--all deletes a whole volume: give only its name, not '{args.target}'")
        volumes.delete_volume(name)
        print(f"deleted volume {name} and every file in it")
        return 0
    name, path = _split(args.target, need_path=f"add --all to delete volume '{args.target}' and every file in it")
    volumes.delete_file(name, path)
    print(f"deleted {name}/{path}")
    return 0


def _ls(volumes: VolumeOperations, args: argparse.Namespace) -> int:
    from fleet_rlm.volumes.quota import human

    if not args.target:
        rows = volumes.volume_list().volumes
        if args.json:
            print_json([v.model_dump(mode="json") for v in rows])
            return 0
        if not rows:
            print("no volumes yet: `fleet-rlm volumes put FILE NAME/memory/FILE` creates one")
        for v in rows:
            share = max(v.bytes / v.quota_bytes, v.files / v.max_files)
            print(
                f"{v.name:<24} {plural(v.files, 'entry', 'entries'):>15} {plural(v.bytes, 'byte'):>20}"
                f"  {share:>4.0%} of quota "
                f"({human(v.quota_bytes)}, {v.max_files:,} entries)"
            )
        return 0
    name, path = _split(args.target)
    entries = volumes.files(name, path, recursive=True, limit=None).entries
    if args.json:
        print_json([e.model_dump(mode="json") for e in entries])
        return 0
    if not entries:
        print(f"{name}/{path.strip('/')} is empty" if path.strip("/") else f"volume {name} is empty")
    for f in entries:
        print(f"{f.type:<5} {f.size:>12,}  {f.path}")
    return 0
