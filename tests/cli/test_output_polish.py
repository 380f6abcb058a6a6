"""Small things the CLI prints: aligned tables, right plurals, one-line errors."""

from __future__ import annotations

import os
import re
import socket
import subprocess
from pathlib import Path

import pytest

from tests.cli.test_cli import BIN, cli


@pytest.mark.slow
def test_config_list_aligns_values_to_the_longest_name(fleet_env: dict[str, str]) -> None:
    proc = cli("config", "list", env=fleet_env)
    assert proc.returncode == 0, proc.stderr
    rows = [re.match(r"(\S+\s+)(.*?)\s+\[", line) for line in proc.stdout.splitlines()]
    assert all(rows)
    value_columns = {len(row.group(1)) for row in rows}  # type: ignore[union-attr]
    assert len(value_columns) == 1  # every value starts in the same column
    source_columns = {line.index(" [") for line in proc.stdout.splitlines()}
    assert len(source_columns) == 1


@pytest.mark.slow
def test_volume_listing_says_1_entry(fleet_env: dict[str, str], tmp_path: Path) -> None:
    note = tmp_path / "a"
    note.write_text("x")
    assert cli("volumes", "put", str(note), "notes/a", env=fleet_env).returncode == 0
    listing = cli("volumes", "ls", env=fleet_env).stdout
    assert " 1 entry " in listing and " 1 byte " in listing and "1 entries" not in listing


@pytest.mark.slow
@pytest.mark.parametrize("command", [["fleet", "web", "--no-open"], ["fleet-mcp", "--transport", "http"]])
def test_busy_port_is_one_line_that_names_the_fix(fleet_env: dict[str, str], command: list[str]) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen(1)
        port = taken.getsockname()[1]
        proc = subprocess.run(
            [str(BIN / command[0]), *command[1:], "--port", str(port)],
            capture_output=True,
            text=True,
            env={**os.environ, **fleet_env},
            timeout=60,
        )
    assert proc.returncode == 2
    assert proc.stderr == f"error: port {port} is in use; pick another with --port N (or --port 0 for any free port)\n"
