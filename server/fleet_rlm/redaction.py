"""Masking secrets out of everything fleet-rlm writes, shows or hands back into a sandbox.

Two nets, applied together by ``redact_text`` (strings) and ``redact`` (JSON-like data); ``redact_known``
applies the first alone, for what a person must see exactly:

* the configured secret values themselves (every key the settings hold), registered by
  ``Settings`` when it loads, so a provider error that echoes a header or a key in any shape
  of text is masked whatever the key looks like: whole, reversed, or split into pieces by white
  space, quotes, commas or brackets (pieces out of order, or only some of them, are not matched);
  in any letter case (an upper-cased token); and encoded, as hex or inside base64 text (standard or
  URL-safe, at any of the three byte alignments, so a key inside a Basic credential is masked too);
* key-shaped patterns (``sk-...``, ``Bearer ...``, GitHub/Hugging Face/Slack tokens) for keys
  fleet-rlm was never told about, and values under secret-looking dict keys (``api_key``, ...).

Imports only the standard library: the CLI's ``--help`` and the MCP server's startup load it.
"""

from __future__ import annotations

import base64
import functools
import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

__all__ = [
    "MASK",
    "MIN_SECRET_CHARS",
    "RedactingFormatter",
    "holds_known_secret",
    "redact",
    "redact_known",
    "redact_text",
    "remember_secrets",
]

MASK = "***"
# Shorter values are not masked by value: masking "abc" everywhere would mangle ordinary text,
# and a key that short protects nothing anyway.
MIN_SECRET_CHARS = 8

_SECRET_KEY_PARTS = ("api_key", "key", "token", "password", "secret", "authorization")
# Usage counters ("prompt_tokens", "max_tokens", ...) contain "token" but are
# not secrets, and masking them would break cost reporting.
_NOT_SECRET_KEY = re.compile(r"tokens", re.IGNORECASE)
# Not preceded by a letter/digit, so "task-..." is left alone but "KEY_sk-..." is not.
_SECRET_SHAPE = re.compile(
    r"(?<![A-Za-z0-9])(?:"
    r"sk-[A-Za-z0-9_\-]{8,}"  # OpenAI / Anthropic style keys
    r"|Bearer\s+[A-Za-z0-9._~+/=\-]{8,}"  # HTTP authorization values (not "bearer of")
    r"|(?:ghp|gho|github_pat|hf|xox[abp])_[A-Za-z0-9_]{16,}"  # GitHub, Hugging Face, Slack
    r")",
    re.IGNORECASE,
)

# What may stand between the pieces of a key printed in parts: white space, quotes, commas, brackets, "+",
# and the escapes JSON writes for a newline, tab, quote or backslash.
_GAP_CHARS = " \t\r\n\"'`,;+|()[]{}<>"
_GAP_ESCAPES = r"\\[nrt\"'\\]"

_lock = threading.Lock()
_known: frozenset[str] = frozenset()
_known_pattern: re.Pattern[str] | None = None  # None: no secret configured, skip the pass


def remember_secrets(values: Iterable[str | None]) -> None:
    """Add secret values to mask from now on, in this process (values too short are ignored)."""
    global _known, _known_pattern
    fresh = {v for v in values if v and len(v) >= MIN_SECRET_CHARS}
    if fresh <= _known:  # the common case: the same settings loaded again
        return
    with _lock:
        known = _known | fresh
        # Longest first, so a key that contains another is masked whole.
        # Any letter case: an upper-cased token (or hex key) is the same secret to whoever reads it. The
        # pattern is of lower-case forms, matched against the text lower-cased (see _masked_known).
        ordered = sorted(known, key=len, reverse=True)
        printed = dict.fromkeys(f.lower() for v in ordered for f in (v, v[::-1]))
        encoded = dict.fromkeys(f.lower() for v in ordered for f in _encoded(v))
        encoded = {f: None for f in sorted(encoded, key=len, reverse=True) if f not in printed}
        alternation = "|".join([*map(_in_pieces, printed), *map(re.escape, encoded)])
        _known_pattern, _known = re.compile(alternation), frozenset(known)


def _encoded(value: str) -> list[str]:
    """The text ``value`` becomes when encoded: hex, and base64 (standard and URL-safe) at each of the
    three alignments it can have inside longer base64 text (``user:key`` in a Basic credential), cut
    to the characters that come from ``value`` alone (the first and last share bits with its neighbours)."""
    raw = value.encode()
    forms = [raw.hex()]
    for offset in range(3):
        text = base64.b64encode(bytes(offset) + raw).decode()
        first, end = (8 * offset + 5) // 6, 8 * (offset + len(raw)) // 6  # the characters of value's bits only
        core = text[first:end]
        forms += [core, core.translate(_URL_SAFE)]
    return [f for f in forms if len(f) >= MIN_SECRET_CHARS]


_URL_SAFE = str.maketrans("+/", "-_")


def _in_pieces(value: str) -> str:
    """A pattern for ``value`` whole or split anywhere by runs of separators (a key printed in pieces).

    A separator that occurs in the value itself is left out, so each gap and the next character of the
    value never compete for a character: the match is linear (and the gaps possessive)."""
    chars = "".join(c for c in _GAP_CHARS if c not in value)
    gap = f"[{re.escape(chars)}]" if "\\" in value else f"(?:[{re.escape(chars)}]|{_GAP_ESCAPES})"
    return f"{gap}*+".join(re.escape(c) for c in value)


def _lowered(text: str) -> str:
    """``text`` in lower case, character for character (a match in it is at the same place in ``text``)."""
    lowered = text.lower()
    # A few characters lower-case to two (U+0130); none to none, so the same length means one for one.
    return lowered if len(lowered) == len(text) else text.translate(_ASCII_LOWER)


_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _masked_known(pattern: re.Pattern[str], text: str) -> str:
    """``text`` with every match of ``pattern`` in its lower-cased form replaced by ``***``."""
    parts, last = [], 0
    for match in pattern.finditer(_lowered(text)):
        parts += [text[last : match.start()], MASK]
        last = match.end()
    return "".join([*parts, text[last:]]) if parts else text


def redact_text(text: str) -> str:
    """``text`` with every configured secret value and key-shaped string replaced by ``***``."""
    pattern = _known_pattern
    if pattern is not None:
        text = _masked_known(pattern, text)
    return _SECRET_SHAPE.sub(MASK, text)


def holds_known_secret(text: str) -> bool:
    """Whether ``text`` contains a configured secret value (in any of the shapes masked)."""
    pattern = _known_pattern
    return pattern is not None and pattern.search(_lowered(text)) is not None


def redact_known(data: Any) -> Any:
    """A copy of JSON-like ``data`` with only the configured secret values masked: no key shapes, no
    secret-looking dict keys. For what a person must see exactly (an approval card), where a key-shaped
    word that is no configured secret is what will run, so masking it would hide that."""
    pattern = _known_pattern
    if pattern is None:
        return data
    if isinstance(data, dict):
        return {k: redact_known(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact_known(v) for v in data]
    if isinstance(data, str):
        return _masked_known(pattern, data)
    return data


@functools.lru_cache(maxsize=4096)  # the same few keys come back in every event
def _secret_key(key: object) -> bool:
    k = str(key).lower()
    return any(part in k for part in _SECRET_KEY_PARTS) and not _NOT_SECRET_KEY.search(k)


def redact(data: Any) -> Any:
    """Return a copy of ``data`` with secrets masked.

    Values under keys that look secret (``api_key``, ``token``, ``password``, ... matched
    case-insensitively as substrings) become ``"***"``; every string goes through
    ``redact_text``.
    """
    if isinstance(data, dict):
        return {k: (MASK if v is not None else None) if _secret_key(k) else redact(v) for k, v in data.items()}
    if isinstance(data, list | tuple):
        return [redact(v) for v in data]
    if isinstance(data, str):
        return redact_text(data)
    return data


class RedactingFormatter(logging.Formatter):
    """A log formatter whose output (message, arguments and traceback) never shows a secret."""

    def format(self, record: logging.LogRecord) -> str:
        return redact_text(super().format(record))
