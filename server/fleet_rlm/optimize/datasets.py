"""Datasets for optimization: rows of (question, context, expected answer) with a train/holdout split.

Built from runs people judged (their feedback) or imported from JSON lines, one object a line::

    {"question": "...", "context": "pasted text" | "context_path": "file or folder" | [...], "answer": "..."}

The split is drawn once, at import, from a seeded shuffle, and stored with the rows: every
optimization of a dataset trains and checks on the same rows. Rows replay through the engine as
new runs, so a context path must still exist when an optimization runs (a run's uploads are kept
while the run is).
"""

from __future__ import annotations

import hashlib
import json
import random
import secrets
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fleet_rlm.errors import Conflict, NotFound, UserError
from fleet_rlm.optimize.views import DatasetDetail, DatasetInfo, DatasetList
from fleet_rlm.store import DatasetRow

if TYPE_CHECKING:
    from fleet_rlm.core.workspace import Workspace
    from fleet_rlm.store import Dataset, JudgedRun

DEFAULT_HOLDOUT = 0.2
MAX_ROWS = 100_000
NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


def check_name(name: str) -> str:
    if not name or len(name) > 64 or not set(name) <= NAME_CHARS or name[0] in ".-":
        raise UserError(f"dataset name {name!r}: use 1-64 letters, digits, '_', '.' or '-' (not first)")
    return name


def example_key(question: str, context_text: str | None, context_paths: list[str]) -> str:
    """A row's identity for the evaluation cache: its inputs, hashed."""
    blob = json.dumps([question, context_text, context_paths], ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


def split_rows(rows: list[dict[str, Any]], holdout: float, seed: int) -> list[DatasetRow]:
    """Number the rows and mark a seeded-random ``holdout`` fraction of them (at least one row when
    there are two or more and the fraction is above 0; never all of them). Rows that all say their
    split (an exported dataset imported again) keep it."""
    if not 0 <= holdout < 1:
        raise UserError(f"holdout must be at least 0 and below 1, not {holdout}")
    if rows and all(r.get("split") in ("train", "holdout") for r in rows):
        return [_dataset_row(i, row["split"], row) for i, row in enumerate(rows)]
    n = len(rows)
    count = min(n - 1, max(1, round(n * holdout))) if holdout > 0 and n >= 2 else 0
    held = set(random.Random(seed).sample(range(n), count))
    return [_dataset_row(i, "holdout" if i in held else "train", row) for i, row in enumerate(rows)]


def _dataset_row(idx: int, split: str, row: dict[str, Any]) -> DatasetRow:
    verdict = row.get("verdict")
    return DatasetRow(
        idx=idx,
        split=split,
        question=row["question"],
        context_text=row.get("context_text"),
        context_paths=row.get("context_paths") or [],
        answer=row["answer"],
        verdict=None if verdict is None else bool(verdict),
        comment=row.get("comment"),
        run_id=row.get("run_id"),
    )


def parse_jsonl(lines: Iterable[str], base: Path | None = None) -> list[dict[str, Any]]:
    """Rows from JSON lines; a bad line fails the import, naming the line and the fix. Relative
    context paths are taken from ``base`` (the file's folder)."""
    rows = []
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
        except ValueError as exc:
            raise UserError(f"line {number}: not valid JSON ({exc.msg})") from None
        rows.append(_row(item, number, base))
        if len(rows) > MAX_ROWS:
            raise UserError(f"more than {MAX_ROWS:,} rows: split the file")
    if not rows:
        raise UserError("no rows: give one JSON object per line with question, answer and context or context_path")
    return rows


def _row(item: Any, number: int, base: Path | None) -> dict[str, Any]:
    where = f"line {number}"
    if not isinstance(item, dict):
        raise UserError(f"{where}: expected a JSON object with question, answer and context or context_path")
    unknown = sorted(set(item) - {"question", "answer", "context", "context_path", "split", "verdict", "comment",
                                  "run_id"})  # fmt: skip
    if unknown:
        raise UserError(f"{where}: unknown field(s) {', '.join(unknown)}")
    question, answer = item.get("question"), item.get("answer")
    if not isinstance(question, str) or not question.strip():
        raise UserError(f"{where}: 'question' must be a non-empty string")
    if isinstance(answer, (int, float)) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer.strip():
        raise UserError(f"{where}: 'answer' (the expected answer) must be a non-empty string")
    context, paths = item.get("context"), item.get("context_path") or []
    if context is not None and not isinstance(context, str):
        raise UserError(f"{where}: 'context' must be a string (the text itself)")
    if isinstance(paths, str):
        paths = [paths]
    if not isinstance(paths, list) or not all(isinstance(p, str) and p for p in paths):
        raise UserError(f"{where}: 'context_path' must be a path or a list of paths")
    resolved = [_context_path(p, base, where) for p in paths]
    return {"question": question, "context_text": context, "context_paths": resolved, "answer": answer,
            "split": item.get("split"), "verdict": item.get("verdict"), "comment": item.get("comment"),
            "run_id": item.get("run_id")}  # fmt: skip


def _context_path(path: str, base: Path | None, where: str) -> str:
    """A row's context path as replays will open it: ``vol:`` as given, a relative one from ``base``."""
    if path.startswith("vol:"):
        return path
    full = Path(path).expanduser()
    if not full.is_absolute():
        if base is None:  # text sent without its file (a browser upload): its folder is unknown
            raise UserError(f"{where}: context_path '{path}' is relative, and nothing says which folder it is "
                            "relative to: give the folder the file is in, or use absolute paths (or "
                            "vol:NAME/PATH)")  # fmt: skip
        full = base / full
    if not full.exists():
        raise UserError(f"{where}: context_path '{full}' does not exist")
    return str(full)


def folder(path: str) -> Path:
    """The folder a JSONL file's relative context paths are taken from, as a person typed it."""
    found = Path(path.strip()).expanduser()
    if not found.is_absolute() or not found.is_dir():
        raise UserError(f"'{path}' is not a folder on this machine: give the full path of the folder the file is in")
    return found


def rows_from_feedback(workspace: Workspace) -> tuple[list[dict[str, Any]], list[str]]:
    """Rows from judged runs (each run's newest feedback), and why some runs were left out.

    Right answers are the expected answer unless the person gave another; a wrong answer counts only
    with the right one given. A replay is a fresh run: pasted text is not kept with a run, and a
    session's later runs build on the REPL state its earlier runs left, so neither can be replayed.
    A session's first run started from a fresh REPL, like a replay, so it can."""
    rows, skipped = [], []
    for run in workspace.store.optimize.judged_runs():
        reason = _unreplayable(run)
        if reason:
            skipped.append(f"{run.run_id}: {reason}")
            continue
        request = run.request
        rows.append({"question": run.question, "context_text": None,
                     "context_paths": list(request.get("context_paths") or []), "answer": _expected(run),
                     "verdict": run.correct, "comment": run.comment, "run_id": run.run_id})  # fmt: skip
    return rows, skipped


def _expected(run: JudgedRun) -> str | None:
    return run.expected or (run.answer if run.correct else None)


def _unreplayable(run: JudgedRun) -> str | None:
    """Why a judged run cannot become a row, or None."""
    if run.request.get("context_text"):
        return "its context was pasted text, which is not kept; use a file"
    if run.earlier:
        return (f"it is run {run.earlier + 1} of session {run.session_id}, so it builds on the REPL state "
                "its earlier runs left, which a replay cannot rebuild; judge the session's first run, or ask the "
                "question as the first run of a new session")  # fmt: skip
    if _expected(run):
        return None
    if run.correct:
        return (f"it was marked correct but gave no answer ({run.status}); mark it wrong and give the expected "
                "answer")  # fmt: skip
    return "marked wrong without the right answer; add the expected answer"


async def create(
    workspace: Workspace,
    name: str,
    rows: list[dict[str, Any]],
    *,
    source: str,
    holdout: float = DEFAULT_HOLDOUT,
    seed: int = 0,
    skipped: list[str] | None = None,
) -> DatasetDetail:
    """Store a dataset and its split; Conflict when the name is taken. ``skipped``: judged runs left
    out of it, and why (shown with the new dataset)."""
    check_name(name)
    if not rows:
        raise UserError("no rows to make a dataset of")
    dataset_id = f"d{int(time.time() * 1000):x}{secrets.token_hex(3)}"
    store = workspace.store
    try:
        await store.write(
            store.optimize.create_dataset, dataset_id, name, source, holdout, seed, split_rows(rows, holdout, seed)
        )
    except ValueError as exc:
        raise Conflict(f"{exc}: choose another --name") from None
    return detail(workspace, name).model_copy(update={"skipped": skipped or []})


async def create_from_feedback(
    workspace: Workspace, name: str, *, holdout: float = DEFAULT_HOLDOUT, seed: int = 0
) -> DatasetDetail:
    """A dataset of the judged runs that can be replayed (``skipped`` says why the others are not)."""
    rows, skipped = rows_from_feedback(workspace)
    if not rows:
        raise UserError("no judged run can be replayed: mark answers right or wrong first"
                        + (f" ({'; '.join(skipped[:3])})" if skipped else ""))  # fmt: skip
    return await create(workspace, name, rows, source="feedback", holdout=holdout, seed=seed, skipped=skipped)


def require(workspace: Workspace, name: str) -> Dataset:
    """The dataset's row; NotFound names the fix."""
    dataset = workspace.store.optimize.get_dataset(name)
    if dataset is None:
        raise NotFound(f"no dataset '{name}': list them with `fleet-rlm dataset ls`, import one with "
                       "`fleet-rlm dataset import FILE --name NAME`")  # fmt: skip
    return dataset


def list_datasets(workspace: Workspace) -> DatasetList:
    return DatasetList(
        datasets=[DatasetInfo.model_validate(d, from_attributes=True) for d in workspace.store.optimize.list_datasets()]
    )


def detail(workspace: Workspace, name: str) -> DatasetDetail:
    """A dataset with its rows and their split."""
    found = require(workspace, name)
    rows = workspace.store.optimize.dataset_rows(found.id)
    return DatasetDetail.model_validate({**asdict(found), "rows": [asdict(r) for r in rows]})


def name_of(workspace: Workspace, dataset_id: str) -> str:
    """A dataset's name from its id (the id itself once the dataset is gone)."""
    found = workspace.store.optimize.get_dataset(dataset_id)
    return found.name if found else dataset_id


def export_lines(workspace: Workspace, name: str) -> Iterator[str]:
    """The dataset as JSON lines in the import format (plus split, verdict, comment, run_id)."""
    dataset = require(workspace, name)
    for row in workspace.store.optimize.dataset_rows(dataset.id):
        item: dict[str, Any] = {"question": row.question, "answer": row.answer}
        if row.context_text is not None:
            item["context"] = row.context_text
        paths = row.context_paths or []
        if paths:
            item["context_path"] = paths[0] if len(paths) == 1 else paths
        item["split"] = row.split
        optional = {"verdict": row.verdict, "comment": row.comment, "run_id": row.run_id}
        item.update({k: v for k, v in optional.items() if v is not None})
        yield json.dumps(item, ensure_ascii=False) + "\n"
