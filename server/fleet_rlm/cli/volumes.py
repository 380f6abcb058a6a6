"""``volumes ls|cat|put|rm``: targets are VOLUME or VOLUME/PATH."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from fleet_rlm.cli.common import print_json


def _split(target: str) -> tuple[str, str]:
    name, _, path = target.removeprefix("vol:").partition("/")
    if not name:
        raise ValueError(f"'{target}': expected VOLUME or VOLUME/PATH")
    return name, path


def cmd_volumes(args: argparse.Namespace) -> int:
    from fleet_rlm.config import load_settings
    from fleet_rlm.volumes import LocalVolumes

    volumes = LocalVolumes(load_settings().volumes_root)
    if args.action == "ls":
        if not args.target:
            rows = volumes.list_volumes()
            if args.json:
                print_json(rows)
                return 0
            if not rows:
                print("no volumes yet: `fleet-rlm volumes put FILE NAME/memory/FILE` creates one")
            for v in rows:
                print(f"{v['name']:<24} {v['files']:>6} files {v['bytes']:>12,} bytes")
            return 0
        name, path = _split(args.target)
        rows = volumes.list_files(name, path, recursive=True)
        if args.json:
            print_json(rows)
            return 0
        for f in rows:
            print(f"{f['type']:<4} {f.get('size') or 0:>12,}  {f['path']}")
        return 0
    name, path = _split(args.target)
    if args.action == "cat":
        sys.stdout.buffer.write(volumes.read(name, path))
        return 0
    if args.action == "put":
        data = sys.stdin.buffer.read() if args.source == "-" else Path(args.source).read_bytes()
        volumes.ensure(name)
        volumes.write(name, path, data)
        print(f"wrote {len(data):,} bytes to {name}/{path}")
        return 0
    volumes.delete(name, path)
    print(f"deleted {name}/{path}")
    return 0
