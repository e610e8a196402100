"""The comparison's report on fixed counts: its pass@k against exact fractions, its Δ(k) against
the difference of the curves, the problems only one model solves, the per-problem counts that let
it be recomputed without drawing again, and its Markdown."""

from __future__ import annotations

import json
import math
from fractions import Fraction

import pytest

from opefo_nemo.eval.boundary_report import (
    boundary_report,
    render_boundary_markdown,
    write_boundary_report,
)
from opefo_nemo.eval.counts import ProblemCount
from opefo_nemo.eval.metrics import pass_at_k_fraction

N = 8
IDS = ["p0", "p1", "p2", "p3", "p4", "p5"]
#: p1 and p4 solved by the base only, p3 by "sharp" only; "wide" solves everything the base does.
CORRECT = {
    "base": [2, 1, 0, 0, 8, 3],
    "sharp": [8, 0, 0, 2, 0, 8],
    "wide": [3, 2, 1, 0, 8, 4],
}
U64 = 2.0**-53


def counts(label: str) -> list[ProblemCount]:
    answers = [{"7": c, "9": N - c} if 0 < c < N else {"7": N} for c in CORRECT[label]]
    pairs = enumerate(zip(CORRECT[label], answers, strict=True))
    return [ProblemCount(i, IDS[i], N, c, a) for i, (c, a) in pairs]


@pytest.fixture(scope="module")
def report():
    models = {label: counts(label) for label in CORRECT}
    calibration = {"p0": (3, 128), "p1": (1, 128)}
    return boundary_report(models, [1, 2, 4], 500, 3, calibration, {"heldout": "h.jsonl"})


def exact_mean(label: str, k: int) -> Fraction:
    values = [pass_at_k_fraction(N, c, k) for c in CORRECT[label]]
    return sum(values, Fraction(0)) / len(values)


def test_pass_at_k_and_delta_match_exact_fractions(report):
    # each value is a mean of log-space estimates, each within ~1e-12 of its fraction (n = 8:
    # Σ|lgamma| < 30, 7 u Σ + 2 u per problem)
    bound = 7 * U64 * 4 * math.lgamma(N + 1) + 2 * U64
    for label in CORRECT:
        for k in (1, 2, 4):
            got = report["models"][label]["pass_at_k"][str(k)]
            assert abs(Fraction(got["value"]) - exact_mean(label, k)) <= bound
            assert got["low"] <= got["value"] <= got["high"]
    for pair in report["comparisons"]:
        for k in (1, 2, 4):
            want = exact_mean(pair["b"], k) - exact_mean(pair["a"], k)
            assert abs(Fraction(pair["delta"][str(k)]["value"]) - want) <= 2 * bound


def test_only_one_model_solves_the_known_problems(report):
    sharp, wide = report["comparisons"]
    assert (sharp["a"], sharp["b"]) == ("base", "sharp")
    assert sharp["only_a"] == ["p1", "p4"] and sharp["only_b"] == ["p3"]
    assert wide["only_a"] == [] and wide["only_b"] == ["p2"]


def test_the_per_problem_counts_recompute_the_report(report):
    rows = report["per_problem"]
    assert [row["id"] for row in rows] == IDS
    assert rows[0]["calibration"] == [3, 128] and rows[2]["calibration"] is None
    assert rows[4]["distinct_answers"] == {"base": 1, "sharp": 1, "wide": 1}
    stored = {
        label: [ProblemCount(i, r["id"], N, r["correct"][label], r["answers"][label])
                for i, r in enumerate(rows)]
        for label in CORRECT
    }  # fmt: skip
    again = boundary_report(stored, report["ks"], 500, 3, {"p0": (3, 128), "p1": (1, 128)},
                            {"heldout": "h.jsonl"})  # fmt: skip
    assert again == report
    assert json.loads(json.dumps(report)) == report  # JSON-ready as it is


def test_the_markdown_marks_intervals_that_exclude_zero(report, tmp_path):
    markdown = render_boundary_markdown(report)
    assert "| model | pass@1 | pass@2 | pass@4 | distinct answers |" in markdown
    wide = next(line for line in markdown.splitlines() if line.startswith("| wide − base"))
    # "wide" has at least the base's count on every problem: Δ(1) > 0 in every resample
    assert wide.split(" | ")[1].endswith(" *")
    assert "Solved by base only (against sharp; correct of 8):" in markdown
    assert "- p4: 8" in markdown
    md, js = write_boundary_report(report, tmp_path)
    assert md.read_text() == markdown
    assert json.loads(js.read_text()) == report


def test_models_of_other_problems_are_refused():
    models = {"base": counts("base"), "other": counts("sharp")[::-1]}
    with pytest.raises(ValueError, match="other: not the same problems"):
        boundary_report(models, [1], 10, 0)
    with pytest.raises(ValueError, match="two models or more"):
        boundary_report({"base": counts("base")}, [1], 10, 0)
