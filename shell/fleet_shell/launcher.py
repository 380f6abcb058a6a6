"""``fleet desktop --install`` / ``--uninstall``: a launcher for the window in the desktop's own menu.

Each builder returns the files a launcher is made of, so the same code writes them and the tests read
them on any OS. Every launcher runs the installed ``fleet`` by absolute path: menus do not search the
shell's PATH (``~/.local/bin`` is often missing from it), and a moved or removed install then fails
visibly instead of starting another ``fleet``.

- Linux: a freedesktop entry in ``$XDG_DATA_HOME/applications`` and the icon in the XDG icon theme.
- macOS: ``~/Applications/fleet-rlm.app``, an app bundle whose executable is a shell script.
- Windows: an Internet Shortcut (``.url``) in the Start menu to a ``.cmd`` beside its icon. A real
  shortcut (``.lnk``) needs COM; the Start menu lists ``.url`` files but not bare ``.cmd`` files.
"""

from __future__ import annotations

import os
import plistlib
import shlex
import shutil
import struct
import sys
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from fleet_rlm import __version__
from fleet_rlm.errors import UserError

APP = "fleet-rlm"
COMMENT = "Recursive language models over long inputs"
ICON_SIZE = 256  # icon.png's size: the folder of the icon theme it goes in
EXEC_RESERVED = set(" \t\n\"'\\><~|&;$*?#()`")  # Desktop Entry spec: an argument holding one is quoted
EXEC_ESCAPED = set('"`$\\')  # ... and inside the quotes these take a backslash


@dataclass(frozen=True)
class LauncherFile:
    path: Path
    content: bytes
    executable: bool = False


@dataclass(frozen=True)
class Launcher:
    files: list[LauncherFile]
    removes: list[Path] = field(default_factory=list)  # what --uninstall deletes (files or whole folders)
    shows: Path | None = None  # what to name to the user: the entry, the app or the shortcut


def icon_png() -> bytes:
    return resources.files("fleet_shell").joinpath("icon.png").read_bytes()


def installed_command() -> Path:
    """The ``fleet`` of this install: beside this interpreter (a venv's or uv tool's bin), else on PATH."""
    name = "fleet.exe" if sys.platform == "win32" else "fleet"
    beside = Path(sys.executable).absolute().parent / name  # not resolved: a venv's python is a symlink
    found = beside if beside.is_file() else shutil.which("fleet")
    if not found:
        raise UserError(
            "cannot find the installed `fleet` command to launch: install fleet-rlm as a tool "
            "(docs/desktop.md, Install) and run `fleet desktop --install` again"
        )
    return Path(found).absolute()


# -- Linux ----------------------------------------------------------------------------------------


def exec_argument(arg: str) -> str:
    """One argument of an Exec key, quoted as the Desktop Entry spec says (before string escaping)."""
    arg = arg.replace("%", "%%")  # field codes start with %
    if not EXEC_RESERVED & set(arg):
        return arg
    return '"' + "".join("\\" + c if c in EXEC_ESCAPED else c for c in arg) + '"'


def string_value(text: str) -> str:
    """A value of type string: backslashes and control characters escaped."""
    return text.replace("\\", "\\\\").replace("\n", "\\n").replace("\t", "\\t").replace("\r", "\\r")


def linux_launcher(data_home: Path, command: Path, icon: bytes) -> Launcher:
    icon_path = data_home / "icons" / "hicolor" / f"{ICON_SIZE}x{ICON_SIZE}" / "apps" / f"{APP}.png"
    entry_path = data_home / "applications" / f"{APP}.desktop"
    exec_line = " ".join(exec_argument(a) for a in (str(command), "desktop"))
    entry = "\n".join([
        "[Desktop Entry]",
        "Type=Application",
        f"Name={APP}",
        f"Comment={COMMENT}",
        f"TryExec={string_value(str(command))}",  # the menu hides the entry once the install is gone
        f"Exec={string_value(exec_line)}",
        f"Icon={string_value(str(icon_path))}",  # a path: no icon-cache refresh needed
        "Terminal=false",
        "Categories=Development;",
        "",
    ])  # fmt: skip
    files = [LauncherFile(icon_path, icon), LauncherFile(entry_path, entry.encode())]
    return Launcher(files, removes=[entry_path, icon_path], shows=entry_path)


def xdg_data_home() -> Path:
    """$XDG_DATA_HOME, or ~/.local/share when it is unset or not absolute (as the spec says)."""
    given = os.environ.get("XDG_DATA_HOME", "")
    return Path(given) if os.path.isabs(given) else Path.home() / ".local" / "share"


# -- macOS ----------------------------------------------------------------------------------------


def icns(png: bytes) -> bytes:
    """An .icns holding the PNG as its 256x256 image ('ic08'): macOS apps take no bare PNG icon."""
    entry = b"ic08" + struct.pack(">I", 8 + len(png)) + png
    return b"icns" + struct.pack(">I", 8 + len(entry)) + entry


def macos_launcher(home: Path, command: Path, icon: bytes) -> Launcher:
    app = home / "Applications" / f"{APP}.app"
    info = {
        "CFBundleName": APP,
        "CFBundleDisplayName": APP,
        "CFBundleIdentifier": "io.github.fleet-rlm.desktop",
        "CFBundleExecutable": APP,
        "CFBundleIconFile": APP,
        "CFBundlePackageType": "APPL",
        "CFBundleShortVersionString": __version__,
        "CFBundleVersion": __version__,
        "LSMinimumSystemVersion": "11.0",
        "NSHighResolutionCapable": True,
    }
    script = f"#!/bin/sh\nexec {shlex.quote(str(command))} desktop\n"
    files = [
        LauncherFile(app / "Contents" / "Info.plist", plistlib.dumps(info)),
        LauncherFile(app / "Contents" / "MacOS" / APP, script.encode(), executable=True),
        LauncherFile(app / "Contents" / "Resources" / f"{APP}.icns", icns(icon)),
    ]
    return Launcher(files, removes=[app], shows=app)


# -- Windows --------------------------------------------------------------------------------------


def ico(png: bytes) -> bytes:
    """An .ico holding the PNG as its one 256x256 image (Windows Vista and later read PNG icons)."""
    header = struct.pack("<HHH", 0, 1, 1)
    entry = struct.pack("<BBBBHHII", 0, 0, 0, 0, 1, 32, len(png), 6 + 16)  # 0 x 0 means 256 x 256
    return header + entry + png


def windows_launcher(appdata: Path, command: Path, icon: bytes) -> Launcher:
    folder = appdata / f"{APP}-launcher"  # ours alone, so --uninstall deletes it whole
    script, icon_path = folder / "fleet-desktop.cmd", folder / f"{APP}.ico"
    shortcut = appdata / "Microsoft" / "Windows" / "Start Menu" / "Programs" / f"{APP}.url"
    # cmd expands % even inside quotes; chcp 65001 reads the UTF-8 path right whatever the code page.
    batch = f'@chcp 65001 >nul\r\n@"{str(command).replace("%", "%%")}" desktop\r\n'
    url = "\r\n".join([
        "[InternetShortcut]",
        f"URL={script.as_uri()}",
        f"IconFile={icon_path}",
        "IconIndex=0",
        "ShowCommand=7",  # minimised: the console of fleet.exe stays out of the way
        "",
    ])  # fmt: skip
    files = [
        LauncherFile(script, batch.encode()),
        LauncherFile(icon_path, ico(icon)),
        LauncherFile(shortcut, url.encode()),
    ]
    return Launcher(files, removes=[shortcut, folder], shows=shortcut)


def appdata() -> Path:
    given = os.environ.get("APPDATA")
    if not given:
        raise UserError("APPDATA is not set, so the Start menu cannot be found: run it from a Windows session")
    return Path(given)


# -- the command ----------------------------------------------------------------------------------


def this_platform(command: Path) -> Launcher:
    if sys.platform == "darwin":
        return macos_launcher(Path.home(), command, icon_png())
    if sys.platform == "win32":
        return windows_launcher(appdata(), command, icon_png())
    return linux_launcher(xdg_data_home(), command, icon_png())


def install(launcher: Launcher) -> None:
    for f in launcher.files:
        f.path.parent.mkdir(parents=True, exist_ok=True)
        f.path.write_bytes(f.content)
        if f.executable:
            f.path.chmod(0o755)


def uninstall(launcher: Launcher) -> list[Path]:
    """Delete the launcher's files; return those that were there."""
    removed = []
    for path in launcher.removes:
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()
        else:
            continue
        removed.append(path)
    return removed


def cmd_install(remove: bool) -> int:
    """``fleet desktop --install`` / ``--uninstall``: one line on stdout saying what changed."""
    command = installed_command()
    launcher = this_platform(command)
    if remove:
        gone = uninstall(launcher)
        print(f"removed {launcher.shows}" if gone else f"no launcher to remove ({launcher.shows} is absent)")
        return 0
    install(launcher)
    print(f"installed {launcher.shows}: it runs {command} desktop")
    return 0
