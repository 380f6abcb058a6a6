"""The limits one run shares across all its nodes."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from fleet_rlm.errors import FleetError


class BudgetExhausted(FleetError):
    """A limit ran out; ``reason`` is recorded as the run's stop reason. The run catches it and ends
    ``partial`` (exit 3), so a face sees it only as that outcome."""

    exit_code = 3

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


@dataclass
class Limits:
    max_iters: int = 20
    max_llm_calls: int = 500
    max_depth: int = 2
    max_seconds: float = 1800.0
    max_cost: float | None = None
    max_tokens: int | None = None


@dataclass
class Budget:
    """Counters shared by a run's root and children; all access happens on one event loop."""

    limits: Limits
    llm_calls: int = 0
    cost: float = 0.0
    tokens: int = 0  # prompt and completion tokens of every call so far
    started: float = field(default_factory=time.monotonic)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started

    @property
    def seconds_left(self) -> float:
        return max(0.0, self.limits.max_seconds - self.elapsed)

    @property
    def calls_left(self) -> int:
        return max(0, self.limits.max_llm_calls - self.llm_calls)

    def check(self) -> None:
        """Raise if time, cost or tokens ran out."""
        if self.elapsed >= self.limits.max_seconds:
            raise BudgetExhausted(f"wall time limit of {self.limits.max_seconds:g} s reached")
        if self.limits.max_cost is not None and self.cost >= self.limits.max_cost:
            raise BudgetExhausted(f"cost limit of ${self.limits.max_cost:g} reached")
        if self.limits.max_tokens is not None and self.tokens >= self.limits.max_tokens:
            raise BudgetExhausted(f"token limit of {self.limits.max_tokens} reached")

    def reserve(self, calls: int = 1) -> None:
        """Claim model calls up front; raise if the run cannot afford them."""
        self.check()
        if self.llm_calls + calls > self.limits.max_llm_calls:
            raise BudgetExhausted(f"model call limit of {self.limits.max_llm_calls} reached")
        self.llm_calls += calls

    def charge(self, cost: float | None, tokens: int = 0) -> None:
        self.cost += cost or 0.0
        self.tokens += tokens
