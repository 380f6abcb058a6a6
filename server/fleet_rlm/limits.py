"""The run limits, declared once: for each, its bounds, default, unit and meaning.

Every face takes its schema from here (the CLI's flags, the MCP tools' inputs, the web API's request
body, the agent's ``rlm_run``, the settings' fields) and every face refuses a bad value the same way:
``RunRequest`` calls ``check_limits``, so the same bad limit gets the same sentence wherever it came in.
A ``Limit`` in ``Annotated`` metadata publishes its bounds in the JSON Schema without pydantic enforcing
them, so pydantic's own wording never reaches the user for these fields.

A leaf: it imports nothing of the package but the error classes (and no pydantic), so ``--help`` stays fast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Final

from fleet_rlm.errors import UserError


@dataclass(frozen=True)
class Limit:
    name: str
    kind: type[int] | type[float]
    low: int
    high: int
    low_excluded: bool  # the low bound itself is refused: a budget of 0 seconds or $0 is no budget
    default: int | float | None  # the setting's default; None: no limit unless one is set
    unit: str
    description: str
    metavar: str  # how the CLI's help names a value

    @property
    def span(self) -> str:
        """The allowed values in words, as the error message and the CLI's help say them."""
        if self.low_excluded:
            return f"more than {self.low} and at most {self.high}"
        whole = "a whole number " if self.kind is int else ""
        return f"{whole}between {self.low} and {self.high}"

    @property
    def meaning(self) -> str:
        """What it limits, with the range and unit: a setting's description."""
        return f"{self.description}: {self.span} {self.unit}"

    @property
    def default_text(self) -> str:
        return "none" if self.default is None else _shown(self.default)

    @property
    def described(self) -> str:
        """A request field's description: the meaning, and what leaving it out means."""
        return f"{self.meaning}; unset: the setting's value (default {self.default_text})."

    def accepts(self, value: Any) -> bool:
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            return False
        if self.kind is int and not float(value).is_integer():
            return False
        above = value > self.low if self.low_excluded else value >= self.low
        return above and value <= self.high

    def check(self, value: Any) -> None:
        if not self.accepts(value):
            raise UserError(f"{self.name} must be {self.span} (got {_shown(value)})")

    def pydantic_bounds(self) -> dict[str, int]:
        """``Field(**...)`` keywords, for a model that enforces the bounds itself (the settings)."""
        return {"gt" if self.low_excluded else "ge": self.low, "le": self.high}

    def json_schema_bounds(self) -> dict[str, int]:
        return {"exclusiveMinimum" if self.low_excluded else "minimum": self.low, "maximum": self.high}

    def __get_pydantic_json_schema__(self, core_schema: Any, handler: Any) -> dict[str, Any]:
        """As ``Annotated[int | None, LIMIT]``: the bounds go on the number branch, the description on the
        field; the value is checked by ``check`` (through ``RunRequest``), not by pydantic."""
        schema: dict[str, Any] = handler(core_schema)
        for branch in schema.get("anyOf", [schema]):
            if branch.get("type") in ("integer", "number"):
                branch.update(self.json_schema_bounds())
        schema.setdefault("description", self.described)
        return schema


def _shown(value: Any) -> str:
    """A value as people write it: 0 whether it came as 0 or 0.0 (JSON, argparse and Python differ)."""
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return str(int(value))
    return repr(value) if isinstance(value, str) else str(value)


MAX_ITERS: Final = Limit("max_iters", int, 1, 1000, False, 20, "steps", "Steps per RLM node", "N")
MAX_DEPTH: Final = Limit(
    "max_depth", int, 0, 10, False, 2, "levels", "Child RLM nesting depth (0: rlm_query is a plain model call)", "D"
)
MAX_LLM_CALLS: Final = Limit(
    "max_llm_calls", int, 1, 100_000, False, 500, "calls", "Model calls per run, sub-queries and children included",
    "N",
)  # fmt: skip
MAX_SECONDS: Final = Limit("max_seconds", float, 0, 86_400, True, 1800.0, "seconds", "Wall time per run", "S")
MAX_COST: Final = Limit(
    "max_cost", float, 0, 10_000, True, None, "USD",
    "Cost per run at the models' known prices (LiteLLM's, or lm_price_per_mtok_*)", "USD",
)  # fmt: skip
MAX_TOKENS: Final = Limit(
    "max_tokens", int, 1, 1_000_000_000, False, None, "tokens",
    "Tokens per run, prompt and completion, of every model call (sub-queries, children and summaries included)",
    "N",
)  # fmt: skip
LIMITS: Final[dict[str, Limit]] = {limit.name: limit for limit in (MAX_ITERS, MAX_DEPTH, MAX_LLM_CALLS, MAX_SECONDS,
                                                                    MAX_COST, MAX_TOKENS)}  # fmt: skip


def check_limits(values: dict[str, Any]) -> None:
    """Refuse the first bad limit among ``values`` (other keys, and None, are left alone)."""
    for name, limit in LIMITS.items():
        if values.get(name) is not None:
            limit.check(values[name])
