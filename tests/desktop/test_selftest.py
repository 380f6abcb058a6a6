"""`fleet desktop --self-test --screenshot`: a real window (Qt offscreen) on the real server, the page
signed in through the JS bridge, a screenshot that shows something; and the command without the extra."""

from __future__ import annotations

import re
import stat
import subprocess
from pathlib import Path

import pytest

from fleet_rlm.cli.main import main
from fleet_shell import deps
from tests.desktop.conftest import BIN, require_desktop


def _pixels(path: Path) -> list[int]:
    """Grey levels of a grid of the PNG's pixels (Qt reads the file; no GUI needed)."""
    from PySide6.QtGui import QImage

    image = QImage(str(path))
    assert not image.isNull(), f"{path} is not a readable image"
    w, h = image.width(), image.height()
    return [image.pixelColor(x, y).lightness() for x in range(0, w, 7) for y in range(0, h, 7)]


@pytest.mark.slow
def test_self_test_opens_the_window_signs_in_and_writes_a_screenshot(desktop_env: dict, tmp_path: Path) -> None:
    shot = tmp_path / "shots" / "shot.png"
    proc = subprocess.run(
        [str(BIN / "fleet"), "desktop", "--self-test", "--screenshot", str(shot)],
        capture_output=True, text=True, env=desktop_env, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = proc.stdout
    assert "answers /health" in out and "signed in through the JS bridge" in out, out
    assert "self-test: passed" in out
    size = re.search(r"screenshot .* \((\d+)x(\d+)\)", out)
    assert size and int(size.group(1)) >= 640 and int(size.group(2)) >= 480, out
    grey = _pixels(shot)
    mean = sum(grey) / len(grey)
    spread = (sum((g - mean) ** 2 for g in grey) / len(grey)) ** 0.5
    assert len(set(grey)) > 20 and spread > 10, f"the screenshot looks blank: {len(set(grey))} levels, sd {spread:.1f}"
    # The window's remembered size is the user's only, in a folder that is the user's only.
    home = Path(desktop_env["FLEET_HOME"])
    assert stat.S_IMODE((home / "desktop.json").stat().st_mode) == 0o600
    assert stat.S_IMODE(home.stat().st_mode) == 0o700


def test_without_the_extra_the_command_says_how_to_install_it(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(deps, "_present", lambda module: module != "webview")
    assert main(["desktop"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: fleet desktop needs webview: install the desktop extra"), err
    assert 'uv tool install "fleet-rlm[desktop] @ file://$PWD"' in err[0] and "uv run --extra desktop" in err[0]


def test_help_works_without_the_extra(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(deps, "_present", lambda module: False)
    with pytest.raises(SystemExit) as exit_:
        main(["desktop", "--help"])
    assert exit_.value.code == 0 and "--self-test" in capsys.readouterr().out


def test_the_extra_is_installed_where_the_window_tests_run() -> None:
    require_desktop()
    assert deps.missing() == []
