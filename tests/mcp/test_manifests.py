"""Packaging files agree with the code and carry no secrets."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from fleet_rlm import __version__
from tests.mcp.conftest import ROOT

MANIFESTS = ROOT / "manifests"
SECRET_LOOKING = re.compile(r"sk-[A-Za-z0-9]{8,}|Bearer\s+\w{8,}|ghp_\w{16,}")


def load(name: str) -> dict[str, Any]:
    return json.loads((MANIFESTS / name).read_text(encoding="utf-8"))


def test_registry_server_json() -> None:
    server = load("server.json")
    assert server["$schema"].endswith("/2025-12-11/server.schema.json")
    assert re.fullmatch(r"[a-zA-Z0-9.-]+/[a-zA-Z0-9._-]+", server["name"])
    assert f"mcp-name: {server['name']}" in (ROOT / "README.md").read_text()  # PyPI ownership proof
    assert 0 < len(server["description"]) <= 100
    assert server["version"] == __version__
    (package,) = server["packages"]
    assert package["registryType"] == "pypi" and package["identifier"] == "fleet-rlm"
    assert package["version"] == __version__ and package["runtimeHint"] == "uvx"
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


def test_client_configs() -> None:
    claude_code = load(".mcp.json")["mcpServers"]["fleet-rlm"]
    assert claude_code["command"] == "uvx" and claude_code["args"] == ["--from", "fleet-rlm", "fleet-mcp"]
    assert claude_code["env"]["FLEET_LM_API_KEY"] == "${FLEET_LM_API_KEY}"  # a reference, never a value
    desktop = load("claude_desktop_config.json")["mcpServers"]["fleet-rlm"]
    assert desktop["args"][-1] == "fleet-mcp" and "FLEET_LM_API_KEY" not in desktop["env"]


@pytest.mark.parametrize("name", ["server.json", "manifest.json", ".mcp.json", "claude_desktop_config.json"])
def test_no_secrets_in_manifests(name: str) -> None:
    assert not SECRET_LOOKING.search((MANIFESTS / name).read_text(encoding="utf-8"))
