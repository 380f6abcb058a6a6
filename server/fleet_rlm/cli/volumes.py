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
    from fleet_rlm.volumes.quota import human

    volumes = LocalVolumes.from_settings(load_settings())
    if args.action == "ls":
        if not args.target:
            rows = volumes.list_volumes()
            if args.json:
                print_json(rows)
                return 0
            if not rows:
                print("no volumes yet: `fleet-rlm volumes put FILE NAME/memory/FILE` creates one")
            for v in rows:
                share = max(v["bytes"] / v["quota_bytes"], v["files"] / v["max_files"])
                print(
                    f"{v['name']:<24} {v['files']:>7,} entries {v['bytes']:>14,} bytes  {share:>4.0%} of quota "
                    f"({human(v['quota_bytes'])}, {v['max_files']:,} entries)"
                )
            return 0
        name, path = _split(args.target)
        rows = volumes.list_files(name, path, recursive=True)
        if args.json:
            print_json(rows)
            return 0
        for f in rows:
            print(f"{f['type']:<5} {f.get('size') or 0:>12,}  {f['path']}")
        return 0
    name, path = _split(args.target)
    if args.action == "cat":
        sys.stdout.buffer.write(volumes.read(name, path))
        return 0
    if args.action == "put":
        data = sys.stdin.buffer.read() if args.source == "-" else Path(args.source).read_bytes()
        volumes.write(name, path, data)  # creates the volume; refuses links and writes over quota
        print(f"wrote {len(data):,} bytes to {name}/{path}")
        return 0
    volumes.delete(name, path)
    print(f"deleted {name}/{path}")
    return 0
