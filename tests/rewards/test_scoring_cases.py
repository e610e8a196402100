"""The reward case table (cases.py) judged by each verifier, the scores each verifier gives by
default, and the relation between `dapo` and `answer`."""

from __future__ import annotations

import pytest

from opefo_nemo.rewards import ScoringConfig, score
from opefo_nemo.rewards.result import WRONG, ScoringConfigError
from tests.rewards.cases import CASES, LONG_TAIL, QUIRKS, C, N, W

T = "timeout"


def _params(column: int) -> list:
    return [
        pytest.param(case[1], case[2], case[column], id=case[0])
        for case in CASES
        if case[column] is not None
    ]


@pytest.mark.parametrize(("response", "truth", "expected"), _params(3))
def test_dapo_verifier(response: str, truth: str, expected: str) -> None:
    result = score(response, truth, verifier="dapo")
    assert result.reason == expected, result
    assert result.score == (1.0 if expected == C else -1.0)
    assert (result.answer is None) == (expected == N)


@pytest.mark.parametrize(("response", "truth", "expected"), _params(4))
def test_answer_verifier(response: str, truth: str, expected: str) -> None:
    result = score(response, truth, verifier="answer")
    assert result.reason == expected, result
    assert result.score == (1.0 if expected == C else 0.0)
    assert (result.answer is None) == (expected == N)


@pytest.mark.parametrize(("response", "truth", "expected"), _params(5))
def test_math_verify_verifier(response: str, truth: str, expected: str) -> None:
    result = score(response, truth, verifier="math_verify")
    assert result.reason == expected, result
    assert result.score == (1.0 if expected == C else 0.0)


def test_each_verifier_is_judged_on_at_least_100_cases() -> None:
    for column in (3, 4, 5):
        assert len(_params(column)) >= 100


@pytest.mark.parametrize("case", CASES, ids=[case[0] for case in CASES])
def test_answer_accepts_what_dapo_accepts_except_the_quirks(case: tuple) -> None:
    name, response, truth = case[:3]
    dapo = score(response, truth, verifier="dapo").correct
    answer = score(response, truth, verifier="answer").correct
    if name in QUIRKS:
        assert dapo and not answer, QUIRKS[name]
    else:
        assert answer or not dapo


STRICT_BOX_CASES = [
    ("nested", "Thus $\\boxed{\\frac{\\sqrt{3}}{2}}$.", "\\frac{\\sqrt{3}}{2}", C),
    ("several-last-wins", "First \\boxed{3}, no wait: \\boxed{4}", "4", C),
    ("several-first-loses", "First \\boxed{3}, no wait: \\boxed{4}", "3", W),
    ("dfrac-in-box", "\\boxed{\\dfrac{2}{3}}", "\\frac{2}{3}", C),
    ("unclosed-box", "so \\boxed{\\frac{1}{2}", "\\frac{1}{2}", N),
    ("box-too-early", "\\boxed{9}" + LONG_TAIL, "9", N),
    ("answer-line-ignored", "Answer: 9", "9", N),
    ("fbox", "\\fbox{12}", "12", C),
]


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [pytest.param(r, g, e, id=i) for i, r, g, e in STRICT_BOX_CASES],
)
def test_answer_strict_box(response: str, truth: str, expected: str) -> None:
    result = score(response, truth, config=ScoringConfig(verifier="answer", strict_box=True))
    assert result.reason == expected, result


@pytest.mark.parametrize("verifier", ["dapo", "answer"])
def test_whole_response_is_read_without_tail_limit(verifier: str) -> None:
    config = ScoringConfig(verifier=verifier, tail_chars=None)
    result = score("Answer: 42" + LONG_TAIL, "42", config=config)
    assert result.reason == C and result.answer == "42"


def test_pathological_expression_hits_the_time_limit_in_process() -> None:
    config = ScoringConfig(verifier="math_verify", timeout_s=0.5)
    result = score("$\\boxed{10^{10^{10}}}$", "5", config=config)
    assert (result.reason, result.score, result.answer) == (T, 0.0, None)


@pytest.mark.parametrize(("verifier", "incorrect"), [("dapo", -1.0), ("answer", 0.0)])
@pytest.mark.parametrize(
    "response", [None, 17, b"Answer: 3", "", "\\boxed{", "}}}{{{", "\x00" * 50]
)
def test_model_output_never_raises(verifier: str, incorrect: float, response: object) -> None:
    result = score(response, "3", verifier=verifier)  # type: ignore[arg-type]
    assert result.reason in ("error", N, W)
    assert result.score == incorrect


def test_math_verify_bad_output_scores_zero() -> None:
    for response in (None, "", "\\boxed{", "}}}{{{"):
        result = score(response, "3", verifier="math_verify")  # type: ignore[arg-type]
        assert result.reason in ("error", N, W) and result.score == 0.0


def test_default_scale_per_verifier() -> None:
    for verifier, wrong in (("dapo", -1.0), ("answer", 0.0), ("math_verify", 0.0)):
        assert score("Answer: 3", "3", verifier=verifier).score == 1.0
        assert score("Answer: 4", "3", verifier=verifier).score == wrong
        assert score("no answer here", "3", verifier=verifier).score == wrong
    assert ScoringConfig().verifier == "dapo" and ScoringConfig().score_for("wrong") == -1.0


def test_scores_are_configurable() -> None:
    config = ScoringConfig(correct_score=1.0, incorrect_score=-1.0, no_answer_score=-0.5)
    assert score("Answer: 3", "3", config=config).score == 1.0
    assert score("Answer: 4", "3", config=config).score == -1.0
    assert score("no answer here", "3", config=config).score == -0.5
    timeout = ScoringConfig(verifier="math_verify", timeout_s=0.3, incorrect_score=-1.0)
    assert score("$\\boxed{10^{10^{10}}}$", "5", config=timeout).score == -1.0
    zero = ScoringConfig(verifier="dapo", incorrect_score=0.0)
    assert score("Answer: 4", "3", config=zero).score == 0.0
    assert score("no answer here", "3", config=zero).score == 0.0


def test_bad_ground_truth_and_config_are_refused() -> None:
    with pytest.raises(TypeError, match="ground_truth"):
        score("Answer: 3", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="verifier"):
        score("Answer: 3", "3", verifier="sympy")
    with pytest.raises(ValueError, match="timeout_s"):
        ScoringConfig(timeout_s=0)
    with pytest.raises(ValueError, match="strict_box"):
        ScoringConfig(verifier="dapo", strict_box=True)
    with pytest.raises(ScoringConfigError, match="incorrect_score") as refused:
        ScoringConfig(correct_score=0.5, incorrect_score=0.5)
    assert refused.value.field == "incorrect_score"
    assert ScoringConfig(correct_score=0.5, incorrect_score=0.25).score_for(WRONG) == 0.25
