"""Build the Claude Desktop bundle (MCPB) from this checkout, and record its sha256 in server.json.

    python manifests/bundle.py [--out dist] [--server-json manifests/server.json]

Stages what the bundle needs (``manifest.json``, ``pyproject.toml``, ``uv.lock``, ``README.md``
and the ``server/``, ``shell/``, ``webui/`` and ``examples/incident/`` folders the wheel is built
from, without caches)
in a temporary folder, validates the manifest and packs it with ``mcpb pack`` into
``<out>/fleet-rlm-<version>.mcpb``, then prints the bundle's path and sha256. With
``--server-json`` it writes that sha256 (and the release URL of this version) into the registry
entry: the release step runs it on the bundle it uploads, since every build of the bundle differs
(zip timestamps) and the registry checks the hash.

``mcpb`` is taken from ``--mcpb``, else ``$FLEET_MCPB``, else ``PATH``; it needs Node >= 20
(``npm i @anthropic-ai/mcpb@2.1.2``, as ``.ci/run`` does). Standard library only.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
STAGED_FILES = ("pyproject.toml", "uv.lock", "README.md")
STAGED_FOLDERS = ("server", "shell", "webui", "examples/incident")
RELEASE_URL = "https://github.com/fleet-rlm/fleet-rlm/releases/download/v{version}/fleet-rlm-{version}.mcpb"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def find_mcpb(given: str | None) -> str:
    found = given or os.environ.get("FLEET_MCPB") or shutil.which("mcpb")
    if not found:
        raise SystemExit(
            "bundle: no mcpb CLI: install it with `npm i @anthropic-ai/mcpb@2.1.2` (Node >= 20) and pass "
            "--mcpb node_modules/.bin/mcpb or set FLEET_MCPB"
        )
    return found


def stage(into: Path) -> str:
    """Copy what the bundle contains into ``into``; returns the manifest's version."""
    manifest = json.loads((ROOT / "manifests" / "manifest.json").read_text(encoding="utf-8"))
    shutil.copy2(ROOT / "manifests" / "manifest.json", into / "manifest.json")
    for name in STAGED_FILES:
        shutil.copy2(ROOT / name, into / name)
    for folder in STAGED_FOLDERS:  # the wheel's packages, the UI and the sample it includes (pyproject says so)
        shutil.copytree(ROOT / folder, into / folder, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    # mcpb leaves out *.log by default, and the sample is logs: without them the wheel does not build.
    (into / ".mcpbignore").write_text("!examples/incident/*.log\n", encoding="utf-8")
    return str(manifest["version"])


def run(mcpb: str, *args: str) -> None:
    # The mcpb binary's folder goes first on PATH, so a Node installed next to it (npm node@22) is used.
    env = {**os.environ, "PATH": f"{Path(mcpb).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    done = subprocess.run([mcpb, *args], env=env, capture_output=True, text=True, timeout=300)
    if done.returncode != 0:
        raise SystemExit(f"bundle: `mcpb {' '.join(args)}` failed:\n{done.stdout}{done.stderr}")


def build(out: Path, mcpb: str) -> Path:
    """Validate and pack the bundle into ``out``; returns its path."""
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="fleet-mcpb-") as tmp:
        staged = Path(tmp)
        version = stage(staged)
        bundle = out.resolve() / f"fleet-rlm-{version}.mcpb"
        run(mcpb, "validate", str(staged / "manifest.json"))
        run(mcpb, "pack", str(staged), str(bundle))
    return bundle


def record(server_json: Path, bundle: Path, version: str) -> None:
    """Point the registry entry's MCPB package at this version's release asset, with its sha256."""
    entry = json.loads(server_json.read_text(encoding="utf-8"))
    (package,) = [p for p in entry["packages"] if p["registryType"] == "mcpb"]
    package.update(identifier=RELEASE_URL.format(version=version), version=version, fileSha256=sha256(bundle))
    entry["version"] = version
    server_json.write_text(json.dumps(entry, indent=2) + "\n", encoding="utf-8")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bundle.py", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "dist", help="folder for the .mcpb (default dist/)")
    parser.add_argument("--mcpb", help="path of the mcpb CLI (default $FLEET_MCPB, else PATH)")
    parser.add_argument("--server-json", type=Path, help="write the bundle's sha256 into this server.json")
    args = parser.parse_args(argv)
    bundle = build(args.out, find_mcpb(args.mcpb))
    if args.server_json:
        record(args.server_json, bundle, bundle.stem.removeprefix("fleet-rlm-"))
    print(f"{bundle}\nsha256 {sha256(bundle)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
