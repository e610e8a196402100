"""The reward case table: each row is judged by both verifiers, with the outcome we expect
from each rule (dapo: normalise and compare strings; math_verify: symbolic equivalence)."""

from __future__ import annotations

import pytest

from opefo_nemo.rewards import RewardConfig, score

C, W, N, T = "correct", "wrong", "no_answer", "timeout"
LONG_TAIL = "\n" + "Let me double-check the arithmetic once more. " * 10

# (id, response, ground truth, dapo reason, math_verify reason)
CASES = [
    ("frac", "So we get it.\nAnswer: \\frac{1}{2}", "\\frac{1}{2}", C, C),
    ("dfrac", "Answer: \\dfrac{1}{2}", "\\frac{1}{2}", C, C),
    ("tfrac-vs-decimal", "Answer: \\tfrac{3}{4}", "0.75", W, C),
    ("frac-shorthand", "Answer: $\\frac12$", "\\frac{1}{2}", C, C),
    ("frac-half-shorthand", "Answer: \\frac1{2}", "\\frac{1}{2}", C, C),
    ("slash-fraction", "Answer: 1/2", "\\frac{1}{2}", W, C),
    ("decimal-vs-frac", "Answer: 0.5", "\\frac{1}{2}", W, C),
    ("decimal-equal", "Answer: 0.5", "0.5", C, C),
    ("wrong-frac", "Answer: \\frac{1}{3}", "\\frac{1}{2}", W, W),
    ("neg-frac-spelling", "Answer: \\frac{-1}{2}", "-\\frac{1}{2}", W, C),
    ("nested-braces", "Thus $\\boxed{\\frac{\\sqrt{3}}{2}}$.", "\\frac{\\sqrt{3}}{2}", N, C),
    ("nested-braces-rationalised", "$\\boxed{\\frac{1}{\\sqrt{2}}}$", "\\frac{\\sqrt{2}}{2}", N, C),
    ("several-boxed-last", "First \\boxed{3}, no wait: \\boxed{4}", "4", N, C),
    ("several-boxed-not-first", "First \\boxed{3}, no wait: \\boxed{4}", "3", N, W),
    ("answer-line-last-wins", "Answer: 3\nOops, recheck.\nAnswer: 4", "4", C, C),
    ("answer-line-not-first", "Answer: 3\nOops, recheck.\nAnswer: 4", "3", W, W),
    ("answer-line-boxed", "Answer: $\\boxed{42}$", "42", C, C),
    ("answer-case", "ANSWER: 7", "7", C, C),
    ("missing", "I could not finish the problem.", "3", N, N),
    ("empty-answer-line", "Answer: $$", "3", N, N),
    ("units-cm", "Answer: 12 cm", "12", C, C),
    ("units-text", "Answer: 30\\text{ dollars}", "30", C, C),
    ("units-degrees-circ", "Answer: 90^\\circ", "90", C, C),
    ("units-degrees-word", "Answer: 45 \\text{degrees}", "45", C, C),
    ("percent", "Answer: 25\\%", "25", C, C),
    ("negative", "Answer: -5", "-5", C, C),
    ("negative-sign-missing", "Answer: 5", "-5", W, W),
    ("negative-spaced", "Answer: - 5", "-5", C, C),
    ("interval", "Answer: (1, 2]", "(1,2]", C, C),
    ("interval-wrong-bracket", "Answer: [1, 2]", "(1,2]", W, W),
    ("interval-infinity", "$\\boxed{(-\\infty, 3)}$", "(-\\infty,3)", N, C),
    ("latex-thin-space", "Answer: 3\\,\\sqrt{2}", "3\\sqrt{2}", C, C),
    ("latex-left-right", "Answer: \\left( 1, 2 \\right)", "(1,2)", C, C),
    ("thousands", "Answer: 1,000", "1000", C, C),
    ("thousands-latex", "Answer: 1{,}000{,}000", "1000000", C, C),
    ("equation-rhs", "Answer: x = 7", "7", C, C),
    ("sqrt-shorthand", "Answer: \\sqrt2", "\\sqrt{2}", C, C),
    ("equivalent-radicals", "Answer: 2\\sqrt{3}", "\\sqrt{12}", W, C),
    ("trailing-period", "Answer: 5.", "5", C, C),
    ("pi", "$\\boxed{2\\pi}$", "2\\pi", N, C),
    ("pi-decimal", "Answer: 6.28", "2\\pi", W, W),
    ("polynomial", "$\\boxed{x^2 + 2x + 1}$", "(x+1)^2", N, C),
    ("set-order", "$\\boxed{\\{3, 1, 2\\}}$", "\\{1,2,3\\}", N, C),
    ("answer-beyond-tail", "Answer: 42" + LONG_TAIL, "42", N, C),
]


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [pytest.param(r, g, d, id=i) for i, r, g, d, _ in CASES],
)
def test_dapo_verifier(response: str, truth: str, expected: str) -> None:
    result = score(response, truth, verifier="dapo")
    assert result.reason == expected, result
    assert result.score == (1.0 if expected == C else 0.0)
    assert (result.answer is None) == (expected == N)


@pytest.mark.parametrize(
    ("response", "truth", "expected"),
    [pytest.param(r, g, m, id=i) for i, r, g, _, m in CASES],
)
def test_math_verify_verifier(response: str, truth: str, expected: str) -> None:
    result = score(response, truth, verifier="math_verify")
    assert result.reason == expected, result
    assert result.score == (1.0 if expected == C else 0.0)


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
def test_dapo_strict_box(response: str, truth: str, expected: str) -> None:
    result = score(response, truth, config=RewardConfig(strict_box=True))
    assert result.reason == expected, result


def test_whole_response_is_read_without_tail_limit() -> None:
    result = score("Answer: 42" + LONG_TAIL, "42", config=RewardConfig(tail_chars=None))
    assert result.reason == C and result.answer == "42"


def test_pathological_expression_hits_the_time_limit_in_process() -> None:
    config = RewardConfig(verifier="math_verify", timeout_s=0.5)
    result = score("$\\boxed{10^{10^{10}}}$", "5", config=config)
    assert (result.reason, result.score, result.answer) == (T, 0.0, None)


@pytest.mark.parametrize("verifier", ["dapo", "math_verify"])
@pytest.mark.parametrize(
    "response", [None, 17, b"Answer: 3", "", "\\boxed{", "}}}{{{", "\x00" * 50]
)
def test_model_output_never_raises(verifier: str, response: object) -> None:
    result = score(response, "3", verifier=verifier)  # type: ignore[arg-type]
    assert result.reason in ("error", N, W)
    assert result.score == 0.0


def test_scores_are_configurable() -> None:
    config = RewardConfig(correct_score=1.0, wrong_score=-1.0, no_answer_score=-0.5)
    assert score("Answer: 3", "3", config=config).score == 1.0
    assert score("Answer: 4", "3", config=config).score == -1.0
    assert score("no answer here", "3", config=config).score == -0.5
    timeout = RewardConfig(verifier="math_verify", timeout_s=0.3, wrong_score=-1.0)
    assert score("$\\boxed{10^{10^{10}}}$", "5", config=timeout).score == -1.0


def test_bad_ground_truth_and_config_are_refused() -> None:
    with pytest.raises(TypeError, match="ground_truth"):
        score("Answer: 3", 3)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="verifier"):
        score("Answer: 3", "3", verifier="sympy")
    with pytest.raises(ValueError, match="timeout_s"):
        RewardConfig(timeout_s=0)
