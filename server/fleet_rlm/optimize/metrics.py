"""How an answer is scored against the expected one: each metric gives a score in [0, 1] and a
line of feedback saying why (GEPA's reflection model reads that line to improve instructions).

``exact`` (the strings, trimmed), ``normalised`` (case, punctuation, articles and spacing ignored),
``numeric`` (the first number of each, within a relative tolerance: ``numeric:0.01``), ``f1``
(token overlap, SQuAD-style) and ``judge`` (the configured model decides, with a reason). Plain
metrics import nothing heavy; the judge builds its model when first used.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from fleet_rlm.errors import UserError

if TYPE_CHECKING:
    from fleet_rlm.config import Settings

NAMES = ("exact", "normalised", "numeric", "f1", "judge")
DEFAULT_TOLERANCE = 1e-6
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_NUMBER = re.compile(r"[-+]?(?:\d[\d,]*\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")


@dataclass(frozen=True)
class Score:
    score: float
    feedback: str


class Metric(Protocol):
    name: str

    def __call__(self, expected: str, predicted: str | None, question: str) -> Score: ...


def normalise(text: str) -> str:
    """Lower case, no punctuation, no articles, single spaces."""
    text = "".join(ch for ch in text.lower() if ch not in string.punctuation)
    return " ".join(_ARTICLES.sub(" ", text).split())


def _quote(text: str | None, limit: int = 300) -> str:
    text = (text or "").strip()
    return repr(text if len(text) <= limit else text[:limit] + "…")


def _verdict(ok: bool, expected: str, predicted: str | None, how: str) -> Score:
    if ok:
        return Score(1.0, f"Right: the answer {_quote(predicted)} matches the expected answer ({how}).")
    if not (predicted or "").strip():
        return Score(0.0, f"Wrong: no answer was given; the expected answer is {_quote(expected)}.")
    return Score(0.0, f"Wrong: the answer was {_quote(predicted)} but the expected answer is {_quote(expected)} "
                      f"({how}).")  # fmt: skip


class Exact:
    name = "exact"

    def __call__(self, expected: str, predicted: str | None, question: str) -> Score:
        return _verdict((predicted or "").strip() == expected.strip(), expected, predicted, "compared exactly")


class Normalised:
    name = "normalised"

    def __call__(self, expected: str, predicted: str | None, question: str) -> Score:
        ok = normalise(predicted or "") == normalise(expected)
        return _verdict(ok, expected, predicted, "ignoring case, punctuation, articles and spacing")


def first_number(text: str | None) -> float | None:
    found = _NUMBER.search(text or "")
    if not found:
        return None
    try:
        return float(found.group(0).replace(",", ""))
    except ValueError:
        return None


@dataclass
class Numeric:
    tolerance: float = DEFAULT_TOLERANCE

    @property
    def name(self) -> str:
        return "numeric" if self.tolerance == DEFAULT_TOLERANCE else f"numeric:{self.tolerance:g}"

    def __call__(self, expected: str, predicted: str | None, question: str) -> Score:
        want, got = first_number(expected), first_number(predicted)
        if want is None:
            raise UserError(f"metric numeric: the expected answer {_quote(expected)} holds no number")
        if got is None:
            return Score(0.0, f"Wrong: the answer {_quote(predicted)} holds no number; expected {want:g}.")
        ok = abs(got - want) <= self.tolerance * max(1.0, abs(want))
        return _verdict(ok, expected, predicted, f"numbers {got:g} and {want:g}, relative tolerance {self.tolerance:g}")


class TokenF1:
    name = "f1"

    def __call__(self, expected: str, predicted: str | None, question: str) -> Score:
        want, got = normalise(expected).split(), normalise(predicted or "").split()
        common = sum((Counter(want) & Counter(got)).values())
        if not want or not got or not common:
            f1 = float(want == got)
        else:
            precision, recall = common / len(got), common / len(want)
            f1 = 2 * precision * recall / (precision + recall)
        missing = [w for w in dict.fromkeys(want) if w not in got][:10]
        extra = [w for w in dict.fromkeys(got) if w not in want][:10]
        detail = f"token F1 {f1:.2f} against the expected answer {_quote(expected)}"
        if missing:
            detail += f"; missing words: {', '.join(missing)}"
        if extra:
            detail += f"; extra words: {', '.join(extra)}"
        return Score(round(f1, 4), detail[0].upper() + detail[1:] + ".")


class Judge:
    """The configured model judges whether the answer says what the expected answer says."""

    name = "judge"

    def __init__(self, settings: Settings) -> None:
        self._settings = settings
        self._predict: Any = None
        self._lm: Any = None

    def __call__(self, expected: str, predicted: str | None, question: str) -> Score:
        import dspy

        if self._predict is None:
            from fleet_rlm.core.lm import build_lm

            class JudgeAnswer(dspy.Signature):
                """Decide whether the answer to the question says what the expected answer says.
                Wording may differ; missing or wrong facts make it incorrect. Explain briefly."""

                question: str = dspy.InputField()
                expected: str = dspy.InputField()
                answer: str = dspy.InputField()
                correct: bool = dspy.OutputField()
                reason: str = dspy.OutputField(desc="One or two sentences.")

            self._lm = build_lm(self._settings)
            self._predict = dspy.Predict(JudgeAnswer)
        if not (predicted or "").strip():
            return Score(0.0, f"Wrong: no answer was given; the expected answer is {_quote(expected)}.")
        with dspy.context(lm=self._lm, adapter=dspy.ChatAdapter()):
            verdict = self._predict(question=question, expected=expected, answer=predicted)
        word = "Right" if verdict.correct else "Wrong"
        return Score(1.0 if verdict.correct else 0.0, f"{word} (judged by the model): {verdict.reason}")


def get_metric(spec: str, settings: Settings | None = None) -> Metric:
    """A metric by name: exact, normalised, numeric[:TOLERANCE], f1, judge."""
    name, _, arg = spec.strip().partition(":")
    if name == "numeric":
        try:
            tolerance = float(arg) if arg else DEFAULT_TOLERANCE
        except ValueError:
            tolerance = -1.0
        if not tolerance >= 0:
            raise UserError(f"metric '{spec}': the tolerance must be a number of 0 or more, as in numeric:0.01")
        return Numeric(tolerance)
    if arg:
        raise UserError(f"metric '{spec}': only numeric takes an argument (numeric:0.01)")
    if name == "judge":
        if settings is None:
            raise UserError("metric judge needs the model settings")
        return Judge(settings)
    plain: dict[str, type[Exact | Normalised | TokenF1]] = {"exact": Exact, "normalised": Normalised, "f1": TokenF1}
    if name not in plain:
        raise UserError(f"unknown metric '{spec}': use one of {', '.join(NAMES)} (numeric:TOLERANCE too)")
    return plain[name]()
