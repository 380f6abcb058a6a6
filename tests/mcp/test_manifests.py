"""Packaging files agree with the code and carry no secrets."""

from __future__ import annotations

import importlib.util
import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm import __version__
from fleet_rlm.mcp.server import build_server
from tests.mcp.conftest import ROOT

# manifests/bundle.py is a script, not a package: load it by path.
_spec = importlib.util.spec_from_file_location("bundle", ROOT / "manifests" / "bundle.py")
assert _spec is not None and _spec.loader is not None
bundle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bundle)
RELEASE_URL: str = bundle.RELEASE_URL

MANIFESTS = ROOT / "manifests"
SECRET_LOOKING = re.compile(r"sk-[A-Za-z0-9]{8,}|Bearer\s+\w{8,}|ghp_\w{16,}")


def load(name: str) -> dict[str, Any]:
    return json.loads((MANIFESTS / name).read_text(encoding="utf-8"))


def test_registry_server_json() -> None:
    """The registry entry describes what this project ships: the MCPB bundle (not a PyPI name,
    which belongs to another project); its sha256 is written by manifests/bundle.py at release."""
    server = load("server.json")
    assert server["$schema"].endswith("/2025-12-11/server.schema.json")
    assert re.fullmatch(r"[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+", server["name"])
    assert f"mcp-name: {server['name']}" in (ROOT / "README.md").read_text()
    assert 0 < len(server["description"]) <= 100
    assert server["version"] == __version__
    (package,) = server["packages"]
    assert package["registryType"] == "mcpb" and "registryBaseUrl" not in package and "runtimeHint" not in package
    assert package["identifier"] == RELEASE_URL.format(version=__version__)
    assert package["identifier"].startswith(server["repository"]["url"] + "/releases/download/")
    assert re.fullmatch(r"[0-9a-f]{64}", package["fileSha256"]) and package["version"] == __version__
    assert package["transport"] == {"type": "stdio"}
    env = {e["name"]: e for e in package["environmentVariables"]}
    assert set(env) == {"FLEET_LM_MODEL", "FLEET_LM_API_BASE", "FLEET_LM_API_KEY"}
    assert env["FLEET_LM_API_KEY"]["isSecret"] is True and env["FLEET_LM_MODEL"]["isRequired"] is True
    assert all("value" not in e and "default" not in e for e in env.values())  # nothing filled in


def test_mcpb_manifest() -> None:
    manifest = load("manifest.json")
    assert manifest["manifest_version"] == "0.4" and manifest["version"] == __version__
    server = manifest["server"]
    assert server["type"] == "uv" and (ROOT / server["entry_point"]).is_file()
    assert server["mcp_config"]["args"][-1] == "fleet-mcp"
    config = manifest["user_config"]
    assert config["lm_api_key"]["sensitive"] is True and "default" not in config["lm_api_key"]
    assert config["lm_model"]["required"] is True
    assert server["mcp_config"]["env"] == {
        "FLEET_LM_MODEL": "${user_config.lm_model}",
        "FLEET_LM_API_BASE": "${user_config.lm_api_base}",
        "FLEET_LM_API_KEY": "${user_config.lm_api_key}",
    }


def test_manifest_tools_match_the_server() -> None:
    snapshot = json.loads((Path(__file__).parent / "snapshots" / "tools.json").read_text(encoding="utf-8"))
    assert [t["name"] for t in load("manifest.json")["tools"]] == [t["name"] for t in snapshot]


@pytest.mark.anyio
async def test_manifest_prompts_match_the_server() -> None:
    prompts = await build_server().list_prompts()
    listed = {p["name"]: p["arguments"] for p in load("manifest.json")["prompts"]}
    assert listed == {p.name: [a.name for a in p.arguments or []] for p in prompts}


def test_client_configs() -> None:
    """Snippets start the command `uv tool install` puts on PATH (the checkout form is in the docs)."""
    claude_code = load(".mcp.json")["mcpServers"]["fleet-rlm"]
    assert claude_code["command"] == "fleet-mcp" and claude_code["args"] == []
    assert claude_code["env"]["FLEET_LM_API_KEY"] == "${FLEET_LM_API_KEY}"  # a reference, never a value
    desktop = load("claude_desktop_config.json")["mcpServers"]["fleet-rlm"]
    assert desktop["command"].endswith("/fleet-mcp") and desktop["args"] == []
    assert "FLEET_LM_API_KEY" not in desktop["env"]


# Every page a user reads (all of docs/, not a list that misses the next one) and every client config.
DOCS = ["README.md", "examples/README.md", *sorted(f"docs/{p.name}" for p in (ROOT / "docs").glob("*.md")),
        "manifests/manifest.json", "manifests/server.json", "manifests/.mcp.json",
        "manifests/claude_desktop_config.json"]  # fmt: skip


@pytest.mark.parametrize("name", DOCS)
def test_no_setup_installs_the_pypi_name(name: str) -> None:
    """`fleet-rlm` on PyPI is another project without `fleet-mcp`: no setup may install it."""
    text = (ROOT / name).read_text(encoding="utf-8")
    assert not re.search(r"uvx\s+(--from\s+)?fleet-rlm|pip install fleet-rlm|\"--from\",\s*\"fleet-rlm\"", text)
    # the bare name (with or without extras) installs from the package index: always a path or URL with it
    assert not re.search(r"tool install ['\"]?fleet-rlm(\[[a-z,]+\])?(?![\[\w-])['\"]?(?!\s*@)", text)


def test_docs_use_commands_that_exist() -> None:
    """Every MCP command in the docs is `fleet-mcp` (installed) or `uv run --project <checkout> fleet-mcp`."""
    for name in ("README.md", "docs/mcp.md"):
        text = (ROOT / name).read_text(encoding="utf-8")
        for command in re.findall(r"claude mcp add [^\n]*? -- ([^\n]+)", text):
            assert command.startswith(("fleet-mcp", "uv run --project ")), (name, command)


@pytest.mark.parametrize("name", ["server.json", "manifest.json", ".mcp.json", "claude_desktop_config.json"])
def test_no_secrets_in_manifests(name: str) -> None:
    assert not SECRET_LOOKING.search((MANIFESTS / name).read_text(encoding="utf-8"))
