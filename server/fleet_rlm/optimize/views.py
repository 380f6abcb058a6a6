"""What every face shows of datasets, program versions and optimizations (pydantic models: MCP
returns them as structured output, the web API as JSON, the CLI prints them). No DSPy here."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, Field

from fleet_rlm.types import RunStatus

BUILTIN = "builtin"  # the program version id faces use for the built-in program


class DatasetInfo(BaseModel):
    id: str
    name: str
    source: str = Field(description="'jsonl' (imported) or 'feedback' (judged runs).")
    train: int = Field(description="Rows the optimizer learns from.")
    holdout: int = Field(description="Rows kept back to check that a candidate generalises.")
    holdout_fraction: float
    seed: int
    created_at: float


class DatasetList(BaseModel):
    datasets: list[DatasetInfo]


class DatasetRow(BaseModel):
    idx: int
    split: Literal["train", "holdout"]
    question: str
    context_text: str | None = Field(description="Pasted context (cut to 500 characters in listings).")
    context_paths: list[str]
    answer: str = Field(description="The expected answer.")
    verdict: bool | None = Field(description="The person's judgement of the run the row came from, if any.")
    comment: str | None
    run_id: str | None


class DatasetDetail(DatasetInfo):
    rows: list[DatasetRow]
    skipped: list[str] = Field(default_factory=list, description="Judged runs left out, and why (import only).")


class Scores(BaseModel):
    train_before: float | None = None
    train_after: float | None = None
    holdout_before: float | None = None
    holdout_after: float | None = None
    n_train: int = 0
    n_holdout: int = 0


class Gate(BaseModel):
    passed: bool = Field(description="Whether promotion would pass without an override.")
    reason: str = Field(description="The scores that decide it.")


class VersionInfo(BaseModel):
    id: str
    base_id: str | None = Field(description="The version it was optimized from (null: the built-in program).")
    optimization_id: str | None
    dataset_id: str | None
    optimizer: str
    metric: str
    scores: Scores
    gate: Gate = Field(description="The promotion gate's verdict on its scores (default tolerance).")
    created_at: float
    active: bool


class VersionList(BaseModel):
    active: str = Field(description=f"The version new runs use ('{BUILTIN}': the built-in program).")
    versions: list[VersionInfo]
    history: list[dict[str, Any]] = Field(description="Promotions and rollbacks, newest first.")


class VersionDetail(VersionInfo):
    changes: dict[str, Any] = Field(
        description="Per predictor, the instructions and demos that changed from the base: {before, after}."
    )


class Comparison(BaseModel):
    a: str
    b: str
    scores: dict[str, Scores]
    instructions: dict[str, str] = Field(description="Per predictor, a unified diff of its instructions (a -> b).")
    demos: dict[str, dict[str, Any]] = Field(description="Per predictor: demos only in a, only in b, and shared.")


class Estimate(BaseModel):
    """What an optimization will cost at most, shown before it starts."""

    evaluations: int = Field(description="Replays of dataset rows (upper bound; cached ones are free).")
    llm_calls: int = Field(description="Model calls at most: replays times the per-run call budget, plus proposals.")
    cost: float | None = Field(description="USD at most, where the model's price is known; null otherwise.")
    max_llm_calls: int | None = Field(description="The cap: the optimization stops once its replays made this many.")


class OptimizationState(BaseModel):
    id: str
    status: RunStatus
    dataset: str
    optimizer: str
    metric: str
    base_version: str | None
    version_id: str | None = Field(description="The version it produced, once finished.")
    scores: Scores
    gate: dict[str, Any] = Field(default_factory=dict, description="Would promotion pass: {passed, reason}.")
    error: str | None
    evaluations: int = 0
    cached: int = Field(0, description="Evaluations skipped because an earlier attempt had done them.")
    trials: list[dict[str, Any]] = Field(
        default_factory=list, description="Per candidate (in order): trial, candidate, mean score, evaluations."
    )
    created_at: float
    finished_at: float | None


class OptimizationList(BaseModel):
    optimizations: list[OptimizationState]
