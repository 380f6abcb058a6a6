"""The setups the README and docs/mcp.md give work as written, from outside the checkout.

* the README's quick start: its commands are read from README.md and run (the scripted LM
  stands in for the model), so the test breaks when the README and the code part ways;
* `uv tool install .`, then `fleet-mcp` started from `manifests/.mcp.json` (Claude Code's
  format, `${VAR:-default}` expanded as Claude Code does) in a folder outside the checkout;
* the MCPB bundle built by `manifests/bundle.py`, started the way Claude Desktop starts it.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from mcp import Client, StdioServerParameters
from tests.mcp import EXPECTED_TOOLS
from tests.mcp.conftest import ROOT, server_env
from tests.mcp.test_real_clients import tool
from tests.support.oracle_lm import OracleLM, Scenario
from tests.support.workloads import NEEDLE_STEPS, write_haystack

pytestmark = pytest.mark.slow

# What a capable model would do with the sample: find the earliest error line and report it.
FIRST_ERROR_STEPS = [
    "errors = sorted(l for l in context.splitlines() if ' ERROR ' in l)\nprint(len(errors), errors[:2])",
    "SUBMIT('The first failure: ' + errors[0])",
]


def uv() -> str:
    found = shutil.which("uv")
    if found is None:
        pytest.skip("uv is not on PATH (the README's install step)")
    return found


def quick_start() -> list[list[str]]:
    """The commands of the README's quick start block (comments and `export` lines left out)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Quick start", 1)[1]
    block = re.search(r"```bash\n(.*?)```", section, re.DOTALL)
    assert block, "the README's quick start has no ```bash block"
    lines = [line.strip() for line in block.group(1).splitlines()]
    return [shlex.split(line) for line in lines if line and not line.startswith(("#", "export "))]


def expand(value: str, env: dict[str, str]) -> str:
    """Claude Code's expansion of `${VAR}` and `${VAR:-default}` in .mcp.json."""
    return re.sub(r"\$\{(\w+)(?::-([^}]*))?\}", lambda m: env.get(m.group(1)) or (m.group(2) or ""), value)


async def list_and_run(params: StdioServerParameters, hay: Path) -> None:
    async with Client(params, mode="legacy") as client:
        assert [t.name for t in (await client.list_tools()).tools] == EXPECTED_TOOLS
        result = await client.call_tool("run", {"question": "What is the secret code?", "context_paths": [str(hay)]})
        assert not result.is_error, result.content
        assert result.structured_content["answer"] == "KESTREL2"  # type: ignore[index]


def test_readme_quick_start_runs(fleet_env: dict[str, str], oracle: OracleLM) -> None:
    commands = quick_start()
    # The sample run, the browser workspace (tests/web/test_serve.py runs it), the tests.
    assert [c[:3] for c in commands] == [["uv", "run", "fleet-rlm"], ["uv", "run", "fleet"], ["uv", "run", "pytest"]]
    assert commands[1] == ["uv", "run", "fleet", "web"], commands
    run = commands[0]
    assert run[3] == "run" and "--context" in run
    question = run[4]
    oracle.add(Scenario(question, FIRST_ERROR_STEPS))
    # Run as written, from the checkout's root (the paths in it are relative to it).
    out = subprocess.run([uv(), *run[1:]], cwd=ROOT, env=server_env(fleet_env), capture_output=True, text=True,
                         timeout=600)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "2026-11-28T02:14:07.000Z ERROR orders.db connection pool exhausted" in out.stdout, out.stdout[-2000:]


@pytest.mark.anyio
async def test_uv_tool_install_then_claude_code_config(
    fleet_env: dict[str, str], oracle: OracleLM, tmp_path: Path
) -> None:
    oracle.add(Scenario("secret code", NEEDLE_STEPS))
    tools, bin_dir, elsewhere = tmp_path / "tools", tmp_path / "bin", tmp_path / "elsewhere"
    elsewhere.mkdir()
    uv_env = {**os.environ, "UV_TOOL_DIR": str(tools), "UV_TOOL_BIN_DIR": str(bin_dir)}
    installed = subprocess.run([uv(), "tool", "install", "."], cwd=ROOT, env=uv_env, capture_output=True, text=True,
                               timeout=900)  # fmt: skip
    assert installed.returncode == 0, installed.stderr[-3000:]
    assert {"fleet", "fleet-rlm", "fleet-mcp"} <= {p.name for p in bin_dir.iterdir()}
    # The installed package, not the checkout, is what runs.
    probe = "import fleet_rlm; from fleet_rlm.core.sample import SAMPLE; print(fleet_rlm.__file__); print(SAMPLE)"
    where = subprocess.run([str(tools / "fleet-rlm" / "bin" / "python"), "-c", probe],
                           capture_output=True, text=True, timeout=60, cwd=elsewhere)  # fmt: skip
    package, sample = map(Path, where.stdout.split())
    assert package.is_relative_to(tools), where
    # The sample a first run is offered ships in the wheel, whole.
    assert sample.is_relative_to(tools) and sorted(p.name for p in sample.iterdir()) == sorted(
        p.name for p in (ROOT / "examples" / "incident").iterdir()
    )

    config = json.loads((ROOT / "manifests" / ".mcp.json").read_text(encoding="utf-8"))["mcpServers"]["fleet-rlm"]
    user_env = {"PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}", **fleet_env}
    command = shutil.which(config["command"], path=user_env["PATH"])
    assert command is not None and Path(command).parent == bin_dir, command
    env = {**server_env(fleet_env), "PATH": user_env["PATH"]}
    env.update({k: expand(v, user_env) for k, v in config.get("env", {}).items()})
    assert env["FLEET_LM_API_BASE"] == oracle.base_url and env["FLEET_LM_API_KEY"] == fleet_env["FLEET_LM_API_KEY"]
    hay = write_haystack(tmp_path / "hay.txt", 300_000, "KESTREL2")
    await list_and_run(StdioServerParameters(command=command, args=config["args"], env=env, cwd=str(elsewhere)), hay)


@pytest.mark.anyio
async def test_bundle_builds_and_starts_like_claude_desktop(
    fleet_env: dict[str, str], oracle: OracleLM, tmp_path: Path
) -> None:
    mcpb = tool("FLEET_MCPB")
    oracle.add(Scenario("secret code", NEEDLE_STEPS))
    server_json = tmp_path / "server.json"
    shutil.copy(ROOT / "manifests" / "server.json", server_json)
    built = subprocess.run(
        [sys.executable, str(ROOT / "manifests" / "bundle.py"), "--out", str(tmp_path / "dist"), "--mcpb", str(mcpb),
         "--server-json", str(server_json)],
        capture_output=True, text=True, timeout=600, cwd=tmp_path,
    )  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    bundle_line, sha_line = built.stdout.strip().splitlines()[-2:]
    bundle = Path(bundle_line)
    digest = hashlib.sha256(bundle.read_bytes()).hexdigest()
    assert sha_line == f"sha256 {digest}"
    (package,) = json.loads(server_json.read_text(encoding="utf-8"))["packages"]
    assert package["fileSha256"] == digest and package["identifier"].endswith("/" + bundle.name)

    unpacked = tmp_path / "extension"  # what Claude Desktop does with an installed bundle
    with zipfile.ZipFile(bundle) as z:
        names = set(z.namelist())
        assert {"manifest.json", "pyproject.toml", "uv.lock", "server/fleet_rlm/mcp/server.py"} <= names
        assert not any("__pycache__" in n for n in names)
        z.extractall(unpacked)
    manifest = json.loads((unpacked / "manifest.json").read_text(encoding="utf-8"))
    launch = manifest["server"]["mcp_config"]
    user_config = {"lm_model": fleet_env["FLEET_LM_MODEL"], "lm_api_base": oracle.base_url,
                   "lm_api_key": fleet_env["FLEET_LM_API_KEY"]}  # fmt: skip

    def fill(value: str) -> str:
        value = value.replace("${__dirname}", str(unpacked))
        return re.sub(r"\$\{user_config\.(\w+)\}", lambda m: user_config[m.group(1)], value)

    # Desktop passes the user's environment on (uv reads its index and certificate settings from it).
    inherited = {k: v for k, v in os.environ.items() if not k.startswith("FLEET_")}
    env = {**inherited, **server_env(fleet_env), **{k: fill(v) for k, v in launch["env"].items()}}
    command = shutil.which(launch["command"]) or pytest.fail(f"{launch['command']} is not on PATH")
    params = StdioServerParameters(command=command, args=[fill(a) for a in launch["args"]], env=env, cwd=str(tmp_path))
    hay = write_haystack(tmp_path / "hay.txt", 300_000, "KESTREL2")
    await list_and_run(params, hay)
