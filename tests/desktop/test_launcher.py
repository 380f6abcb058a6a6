"""``fleet desktop --install`` / ``--uninstall``: on Linux through the real command (the entry it writes is
read back as a menu would read it, and its Exec line is run); the macOS and Windows launchers are built
into a temporary home and checked the same way (their scripts run here too, pointed at a fake ``fleet``)."""

from __future__ import annotations

import configparser
import os
import plistlib
import re
import shlex
import shutil
import struct
import subprocess
from pathlib import Path

from fleet_shell.launcher import icon_png, install, linux_launcher, macos_launcher, uninstall, windows_launcher
from tests.desktop.conftest import BIN

STRING_ESCAPES = {"s": " ", "n": "\n", "t": "\t", "r": "\r", "\\": "\\"}


def read_entry(path: Path) -> dict[str, str]:
    """The [Desktop Entry] group's keys, string escapes undone (Desktop Entry spec, "Possible value types")."""
    lines = path.read_text().splitlines()
    assert lines[0] == "[Desktop Entry]"
    pairs = (line.split("=", 1) for line in lines[1:] if line and not line.startswith("#"))
    return {k: re.sub(r"\\(.)", lambda m: STRING_ESCAPES[m.group(1)], v) for k, v in pairs}


def exec_argv(value: str) -> list[str]:
    """An Exec value split as a launcher does ("The Exec key"): double quotes group, backslash escapes inside."""
    args: list[str] = []
    current, quoted, started, chars = "", False, False, iter(value)
    for c in chars:
        if quoted and c == "\\":
            current += next(chars)
        elif c == '"':
            quoted, started = not quoted, True
        elif c == " " and not quoted:
            if started:
                args.append(current)
            current, started = "", False
        else:
            current, started = current + c, True
    assert not quoted, f"unbalanced quote in {value!r}"
    args = [*args, current] if started else args
    assert all(re.fullmatch(r"([^%]|%%)*", a) for a in args), f"a field code in {value!r}"  # we pass none
    return [a.replace("%%", "%") for a in args]


def fleet(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(BIN / "fleet"), "desktop", *args], capture_output=True, text=True, env=env,
                          timeout=120)  # fmt: skip


def test_install_adds_a_menu_entry_that_runs_this_fleet_and_uninstall_removes_it(tmp_path: Path) -> None:
    data = tmp_path / "data home"  # a space in it, as a home folder may have
    env = {**os.environ, "XDG_DATA_HOME": str(data), "HOME": str(tmp_path / "home")}
    proc = fleet(env, "--install")
    assert proc.returncode == 0, proc.stderr
    entry_path = data / "applications" / "fleet-rlm.desktop"
    assert proc.stdout.startswith(f"installed {entry_path}")
    validator = shutil.which("desktop-file-validate")
    if validator:  # not on every machine; the checks below hold either way
        check = subprocess.run([validator, str(entry_path)], capture_output=True, text=True)
        assert check.returncode == 0 and not check.stdout.strip(), check.stdout
    entry = read_entry(entry_path)
    assert entry["Type"] == "Application" and entry["Terminal"] == "false"
    icon = Path(entry["Icon"])
    assert icon == data / "icons" / "hicolor" / "256x256" / "apps" / "fleet-rlm.png"
    assert icon.read_bytes() == icon_png()
    argv = exec_argv(entry["Exec"])
    assert argv == [str(BIN / "fleet"), "desktop"] and entry["TryExec"] == argv[0]
    ran = subprocess.run([*argv, "--help"], capture_output=True, text=True, env=env, timeout=60)
    assert ran.returncode == 0 and "--self-test" in ran.stdout  # the entry starts this install's `fleet desktop`

    again = fleet(env, "--install")  # installing twice just rewrites the entry
    assert again.returncode == 0 and read_entry(entry_path) == entry
    removed = fleet(env, "--uninstall")
    assert removed.returncode == 0 and removed.stdout.strip() == f"removed {entry_path}"
    assert not entry_path.exists() and not icon.exists()
    assert (data / "applications").is_dir()  # the menu's folder stays, other apps live there
    nothing = fleet(env, "--uninstall")
    assert nothing.returncode == 0 and "no launcher to remove" in nothing.stdout


def test_install_with_another_option_is_refused(tmp_path: Path) -> None:
    proc = fleet({**os.environ, "XDG_DATA_HOME": str(tmp_path)}, "--install", "--self-test")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --install and --uninstall take no other option")
    assert not any(tmp_path.iterdir())


def test_the_exec_line_keeps_an_awkward_path_whole(tmp_path: Path) -> None:
    command = Path('/opt/my apps/$HOME/100%/it\'s "fleet"\\bin/fleet')
    launcher = linux_launcher(tmp_path, command, b"png")
    install(launcher)
    entry = read_entry(tmp_path / "applications" / "fleet-rlm.desktop")
    assert exec_argv(entry["Exec"]) == [str(command), "desktop"]


def fake_fleet(folder: Path) -> tuple[Path, Path]:
    """A stand-in for the installed `fleet` that records its arguments, in a folder with awkward characters."""
    folder.mkdir(parents=True)
    called = folder / "called.txt"
    command = folder / "fleet"
    command.write_text(f'#!/bin/sh\necho "$@" > {shlex.quote(str(called))}\n')
    command.chmod(0o755)
    return command, called


def test_macos_app_bundle_runs_the_installed_fleet(tmp_path: Path) -> None:
    command, called = fake_fleet(tmp_path / "my tools" / "it's $here")
    home = tmp_path / "home"
    launcher = macos_launcher(home, command, icon_png())
    install(launcher)
    app = home / "Applications" / "fleet-rlm.app"
    info = plistlib.loads((app / "Contents" / "Info.plist").read_bytes())
    assert info["CFBundlePackageType"] == "APPL" and info["CFBundleIdentifier"]
    executable = app / "Contents" / "MacOS" / info["CFBundleExecutable"]
    subprocess.run([str(executable)], check=True, timeout=30)  # the bundle's script, run as Finder would
    assert called.read_text().split() == ["desktop"]
    icns = (app / "Contents" / "Resources" / f"{info['CFBundleIconFile']}.icns").read_bytes()
    assert icns[:4] == b"icns" and struct.unpack(">I", icns[4:8])[0] == len(icns)
    assert icns[8:12] == b"ic08" and icns[16:] == icon_png()  # the 256x256 image, as PNG
    assert uninstall(launcher) == [app] and not app.exists() and (home / "Applications").is_dir()


def test_windows_start_menu_shortcut_runs_the_installed_fleet(tmp_path: Path) -> None:
    appdata = tmp_path / "AppData" / "Roaming"
    command = Path(r"C:\Users\me\100% sure\fleet.exe")
    launcher = windows_launcher(appdata, command, icon_png())
    install(launcher)
    programs = appdata / "Microsoft" / "Windows" / "Start Menu" / "Programs"
    shortcut = configparser.ConfigParser(interpolation=None)
    shortcut.read(programs / "fleet-rlm.url")
    section = shortcut["InternetShortcut"]
    script = appdata / "fleet-rlm-launcher" / "fleet-desktop.cmd"
    assert section["URL"] == script.as_uri() and section["ShowCommand"] == "7"
    lines = script.read_bytes().decode().split("\r\n")
    assert lines[-2] == r'@"C:\Users\me\100%% sure\fleet.exe" desktop'  # cmd reads %% as one %
    ico = Path(section["IconFile"]).read_bytes()
    reserved, kind, count = struct.unpack("<HHH", ico[:6])
    *_, size, offset = struct.unpack("<BBBBHHII", ico[6:22])
    assert (reserved, kind, count) == (0, 1, 1) and ico[offset : offset + size] == icon_png()
    uninstall(launcher)
    assert programs.is_dir() and not any(programs.iterdir()) and not script.parent.exists()
