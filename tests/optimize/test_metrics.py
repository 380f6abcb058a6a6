"""Metrics: each gives a score in [0, 1] and feedback text that says why (GEPA reads it)."""

from __future__ import annotations

import pytest

from fleet_rlm.errors import UserError
from fleet_rlm.optimize.metrics import get_metric, normalise
from tests.support.oracle_lm import OracleLM


@pytest.mark.parametrize(
    ("spec", "expected", "predicted", "score"),
    [
        ("exact", "Paris", " Paris\n", 1.0),
        ("exact", "Paris", "paris", 0.0),
        ("exact", "Paris", None, 0.0),
        ("normalised", "The Eiffel Tower", "eiffel tower!", 1.0),
        ("normalised", "Eiffel Tower", "Tower of Eiffel", 0.0),
        ("numeric", "42", "The total is 42.", 1.0),
        ("numeric", "1,234.5", "about 1234.5 units", 1.0),
        ("numeric", "100", "101", 0.0),
        ("numeric:0.02", "100", "101", 1.0),
        ("numeric:0.02", "100", "103", 0.0),
        ("numeric", "7", "seven", 0.0),
        ("f1", "red green blue", "red green blue", 1.0),
        ("f1", "red green blue", "purple", 0.0),
        ("f1", "the red car", "a red car", 1.0),
    ],
)
def test_scores(spec: str, expected: str, predicted: str | None, score: float) -> None:
    result = get_metric(spec)(expected, predicted, "q")
    assert result.score == score
    assert result.feedback.startswith("Token F1" if spec == "f1" else ("Right" if score == 1.0 else "Wrong"))


def test_feedback_names_the_expected_answer_when_wrong() -> None:
    result = get_metric("exact")("Paris", "Lyon", "capital?")
    assert "'Lyon'" in result.feedback and "'Paris'" in result.feedback


def test_f1_is_partial_and_says_what_is_missing() -> None:
    result = get_metric("f1")("red green blue", "red green", "colours?")
    assert result.score == pytest.approx(0.8)
    assert "missing words: blue" in result.feedback


def test_normalise() -> None:
    assert normalise("  The  Quick, brown fox! ") == "quick brown fox"


@pytest.mark.parametrize(("spec", "message"), [
    ("bleu", "unknown metric 'bleu'"),
    ("numeric:abc", "tolerance must be a number"),
    ("numeric:-1", "tolerance must be a number of 0 or more"),
    ("exact:1", "only numeric takes an argument"),
])  # fmt: skip
def test_bad_metric_names_are_refused(spec: str, message: str) -> None:
    with pytest.raises(UserError, match=message):
        get_metric(spec)


def test_numeric_needs_a_number_in_the_expected_answer() -> None:
    with pytest.raises(UserError, match="holds no number"):
        get_metric("numeric")("many", "3", "q")


def test_the_judge_asks_the_configured_model(fleet_env: dict, oracle: OracleLM) -> None:
    from fleet_rlm.config import load_settings

    judge = get_metric("judge", load_settings())
    oracle.state.field_replies.update({"correct": "True", "reason": "Both name the same city."})
    right = judge("Paris", "It is Paris, France.", "What is the capital of France?")
    assert right.score == 1.0 and "Both name the same city" in right.feedback
    sent = str(oracle.requests("root")[-1].messages)
    assert "It is Paris, France." in sent and "What is the capital of France?" in sent
    assert judge("Paris", "", "q").score == 0.0  # no answer: no model call needed
    assert len(oracle.requests("root")) == 1
