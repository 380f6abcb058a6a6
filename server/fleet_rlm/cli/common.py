"""Small helpers every CLI command shares."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any


def fail(exc: BaseException) -> int:
    """Print one clear line for errors a user can fix; exit 2 for those, 1 otherwise."""
    from fleet_rlm.config import ConfigError

    fixable = isinstance(exc, ConfigError | ValueError | KeyError | FileNotFoundError | PermissionError)
    message = exc.args[0] if isinstance(exc, KeyError) and exc.args else str(exc)
    print(f"error: {message or type(exc).__name__}", file=sys.stderr)
    return 2 if fixable else 1


def print_json(value: Any) -> None:
    sys.stdout.write(json.dumps(value, ensure_ascii=False, default=str) + "\n")
    sys.stdout.flush()


def limit_overrides(args: argparse.Namespace) -> dict[str, Any]:
    keys = ("max_iters", "max_depth", "max_llm_calls", "max_seconds", "max_cost")
    return {k: getattr(args, k, None) for k in keys}


def settings_for(args: argparse.Namespace) -> Any:
    from fleet_rlm.config import load_settings

    sandbox = getattr(args, "sandbox", None)
    return load_settings(sandbox=sandbox)
