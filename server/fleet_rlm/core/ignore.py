"""A small ``.gitignore`` matcher for context folders: git's common cases, not all of its rules.

Used only when the folder is inside a git work tree (it or a parent holds ``.git``). The
``.gitignore`` files from the repository's top down to each folder walked apply to that folder's
subtree. Supported: blank lines and ``#`` comments; ``!`` negation (the last matching pattern
wins); a trailing ``/`` (folders only); a ``/`` at the start or in the middle anchors a pattern to
its ``.gitignore``'s folder, otherwise it matches a name at any depth; ``*`` and ``?`` (not across
``/``), ``[...]``, and ``**`` (any number of folders). Not supported: escapes (``\\#``, ``\\!``,
trailing spaces), ``.git/info/exclude`` and the global excludes file; as in git, a file inside an
ignored folder stays ignored even if a later pattern re-includes it.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Reader = Callable[[Path], str | None]  # a file's text, or None when missing/unreadable


@dataclass(frozen=True)
class _Rule:
    base: str  # folder of the .gitignore, relative to the repository top ("" for the top)
    regex: re.Pattern[str]
    negate: bool
    dir_only: bool
    anchored: bool

    def matches(self, rel: str, is_dir: bool) -> bool:
        if self.dir_only and not is_dir:
            return False
        if self.base:
            if not rel.startswith(self.base + "/"):
                return False
            rel = rel[len(self.base) + 1 :]
        return bool(self.regex.fullmatch(rel if self.anchored else rel.rsplit("/", 1)[-1]))


def _translate(pattern: str) -> re.Pattern[str]:
    out, i = [], 0
    while i < len(pattern):
        if pattern.startswith("**/", i):
            out.append("(?:.*/)?")
            i += 3
        elif pattern.startswith("**", i):
            out.append(".*")
            i += 2
        elif pattern[i] == "*":
            out.append("[^/]*")
            i += 1
        elif pattern[i] == "?":
            out.append("[^/]")
            i += 1
        elif pattern[i] == "[" and (end := pattern.find("]", i + 2)) != -1:
            body = pattern[i + 1 : end].replace("\\", "\\\\")
            out.append(f"[{'^' + body[1:] if body.startswith('!') else body}]")
            i = end + 1
        else:
            out.append(re.escape(pattern[i]))
            i += 1
    return re.compile("".join(out))


def parse(text: str, base: str) -> list[_Rule]:
    rules = []
    for line in text.splitlines():
        line = line.rstrip()
        if not line or line.startswith("#"):
            continue
        negate = line.startswith("!")
        line = line[1:] if negate else line
        dir_only = line.endswith("/")
        line = line.rstrip("/")
        anchored = "/" in line
        line = line.lstrip("/")
        if line:
            rules.append(_Rule(base, _translate(line), negate, dir_only, anchored))
    return rules


class GitIgnore:
    """The ignore rules met so far while walking one folder of a git work tree."""

    def __init__(self, prefix: str, read: Reader) -> None:
        self.prefix = prefix  # the walked folder, relative to the repository top
        self.read = read
        self.rules: list[_Rule] = []

    @classmethod
    def find(cls, folder: Path, read: Reader) -> GitIgnore | None:
        """Rules for walking ``folder``, or None when it is not inside a git work tree."""
        real = folder.resolve()
        top = next((p for p in (real, *real.parents) if (p / ".git").exists()), None)
        if top is None:
            return None
        ignore = cls("" if real == top else real.relative_to(top).as_posix(), read)
        for parent in reversed(real.relative_to(top).parents):  # the top first, then down to folder
            ignore._load(top / parent, "" if str(parent) == "." else parent.as_posix())
        return ignore

    def enter(self, folder: Path, rel: str) -> None:
        """Add the ``.gitignore`` of a folder being walked (``rel`` from the walked folder)."""
        self._load(folder, self._repo_rel(rel))

    def ignored(self, rel: str, is_dir: bool) -> bool:
        path = self._repo_rel(rel)
        verdict = False
        for rule in self.rules:
            if rule.matches(path, is_dir):
                verdict = not rule.negate
        return verdict

    def _repo_rel(self, rel: str) -> str:
        return "/".join(p for p in (self.prefix, rel) if p)

    def _load(self, folder: Path, base: str) -> None:
        text = self.read(folder / ".gitignore")
        if text:
            self.rules.extend(parse(text, base))
