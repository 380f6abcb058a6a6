"""What every CLI command shares, above all the one place where errors become exit codes.

``fail`` maps an exception to one stderr line and an exit status: a ``FleetError`` by its
``exit_code`` (2 for a user mistake, 1 for an outage), Ctrl-C 130, a reader that went away
(``| head``) a quiet 0, anything else ``error: internal error: ...`` and 1. The traceback is
shown only with ``FLEET_DEBUG=1``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback
from typing import Any, NoReturn

from fleet_rlm.errors import FleetError, RunNotFound, UserError
from fleet_rlm.limits import LIMITS, Limit

INTERRUPTED = 130
# A finished job's status as an exit code: scripts tell a clean answer (0) from one extracted after a
# budget stop (3), a failure (1) and a cancel (130). docs/cli.md has the table.
STATUS_EXIT = {"succeeded": 0, "partial": 3, "cancelled": INTERRUPTED}


def plural(count: int, one: str, many: str | None = None) -> str:
    """``1 entry``, ``2 entries``, ``1,000 bytes``: a count with its noun in the right number."""
    return f"{count:,} {one if count == 1 else many or one + 's'}"


def status_exit(status: str) -> int:
    return STATUS_EXIT.get(status, 1)


class Parser(argparse.ArgumentParser):
    """argparse, but a usage mistake is one ``error:`` line that says where help is, exit 2."""

    def error(self, message: str) -> NoReturn:
        print(f"error: {message} (see `{self.prog} --help`)", file=sys.stderr)
        sys.exit(UserError.exit_code)


def fail(exc: BaseException) -> int:
    """Report ``exc`` in one line on stderr and return the exit status for it."""
    if isinstance(exc, BrokenPipeError):
        return quiet_broken_pipe()
    if os.environ.get("FLEET_DEBUG") == "1":
        traceback.print_exception(exc, file=sys.stderr)
    if isinstance(exc, KeyboardInterrupt):
        print("interrupted", file=sys.stderr)
        return INTERRUPTED
    if isinstance(exc, FleetError):
        hint = " (`fleet-rlm runs` lists recent ones)" if isinstance(exc, RunNotFound) else ""
        print(f"error: {_one_line(exc.message)}{hint}", file=sys.stderr)
        return exc.exit_code
    detail = _one_line(str(exc)) or type(exc).__name__
    print(f"error: internal error: {type(exc).__name__}: {detail} (FLEET_DEBUG=1 shows where)", file=sys.stderr)
    return 1


def quiet_broken_pipe() -> int:
    """stdout's reader left (``fleet-rlm runs | head``): not an error, so exit 0 without a word.

    Later writes (and Python's final flush) go to /dev/null instead of raising again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 0


def _one_line(text: str) -> str:
    lines = [line.strip() for line in str(text).splitlines() if line.strip()]
    return lines[0] if len(lines) == 1 else "; ".join(lines)[:500]


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def positive(kind: type[int] | type[float]) -> Any:
    """An argparse type: a number above 0 (zero or less would mean no budget at all)."""

    def parse(text: str) -> int | float:
        value = _number(kind, text)
        if value <= 0:
            raise argparse.ArgumentTypeError(f"must be more than 0, not {text}: leave it out for the default")
        return value

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def number(kind: type[int] | type[float]) -> Any:
    """An argparse type: a finite number; a run limit's range is checked later, by ``check_limits``, so the
    CLI refuses a bad one with the sentence every face gives."""

    def parse(text: str) -> int | float:
        return _number(kind, text)

    parse.__name__ = kind.__name__  # argparse names the type in its messages
    return parse


def limit_argument(parser: argparse.ArgumentParser, limit: Limit, help: str | None = None) -> None:
    """The flag of a run limit (``--max-iters``), its type and help from the limit's declaration."""
    meaning = limit.meaning[:1].lower() + limit.meaning[1:]
    parser.add_argument(
        "--" + limit.name.replace("_", "-"),
        type=number(limit.kind),
        metavar=limit.metavar,
        help=help or f"{meaning}; left out: the setting's value (default {limit.default_text})",
    )


def not_negative(text: str) -> int:
    value = _number(int, text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be 0 or more, not {text}")
    return int(value)


def _number(kind: type[int] | type[float], text: str) -> int | float:
    try:
        value = kind(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected {'a whole number' if kind is int else 'a number'}, not {text!r}"
        ) from None
    if value != value or value in (float("inf"), float("-inf")):
        raise argparse.ArgumentTypeError(f"expected a finite number, not {text!r}")
    return value


def limit_overrides(args: argparse.Namespace) -> dict[str, Any]:
    return {k: getattr(args, k, None) for k in LIMITS}


def settings_for(args: argparse.Namespace) -> Any:
    from fleet_rlm.config import load_settings

    sandbox = getattr(args, "sandbox", None)
    return load_settings(sandbox=sandbox)


def open_workspace(*, secrets: bool = True) -> Any:
    """The read side alone (no DSPy), so a command that only reads starts instantly. ``secrets=False``
    leaves the keyring unasked, for commands whose output no configured secret needs masking in."""
    from fleet_rlm.config import load_settings
    from fleet_rlm.core.workspace import Workspace

    return Workspace.open(load_settings(secrets=secrets))


def since_date(text: str) -> float:
    """An argparse type: a date (2025-01-31) or date and time (2025-01-31T14:00), local time."""
    try:
        return datetime.datetime.fromisoformat(text).timestamp()
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected a date such as 2025-01-31 or 2025-01-31T14:00, not {text!r}"
        ) from None
