"""avg@k and pass@k against independent references: brute force over all k-subsets, the
plain mean, and the float product formula."""

from __future__ import annotations

import itertools
import json
import random
import sys
from fractions import Fraction
from pathlib import Path

import pytest

from opefo_nemo.eval import (
    avg_at_k,
    benchmark_scores,
    mean_pass_at_k,
    pass_at_k,
    pass_at_k_fraction,
    pass_k_sizes,
    sample_metrics,
    write_report,
)


def brute_force_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """Fraction of all k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 10])
def test_pass_at_k_equals_brute_force(n: int) -> None:
    for c in range(n + 1):
        for k in range(1, n + 1):
            assert pass_at_k_fraction(n, c, k) == brute_force_pass_at_k(n, c, k)
            assert pass_at_k(n, c, k) == float(brute_force_pass_at_k(n, c, k))


def test_pass_at_k_large_n_is_exact() -> None:
    rng = random.Random(0)
    for _ in range(50):
        n = rng.randint(512, 1024)
        c, k = rng.randint(0, n), rng.randint(1, n)
        exact = pass_at_k_fraction(n, c, k)
        # independent exact reference: 1 - prod_{i=0}^{k-1} (n-c-i)/(n-i)
        product = Fraction(1)
        for i in range(k):
            product *= Fraction(max(n - c - i, 0), n - i)
        assert exact == 1 - product
        assert 0.0 <= pass_at_k(n, c, k) <= 1.0
    assert pass_at_k(1024, 1, 1) == 1 / 1024
    assert pass_at_k(1024, 0, 1024) == 0.0 and pass_at_k(1024, 1, 1024) == 1.0


def test_avg_at_k_is_the_mean() -> None:
    rng = random.Random(1)
    matrix = [[rng.random() < 0.3 for _ in range(32)] for _ in range(30)]
    flat = [float(x) for row in matrix for x in row]
    assert avg_at_k(matrix) == pytest.approx(sum(flat) / len(flat), abs=1e-15)
    assert avg_at_k([[1, 0], [1]]) == pytest.approx(0.75)  # each problem weighs the same
    assert mean_pass_at_k(matrix, 1) == pytest.approx(avg_at_k(matrix), abs=1e-15)
    expected = sum(float(brute_force_pass_at_k(4, sum(r), 2)) for r in [[1, 0, 0, 0], [0] * 4]) / 2
    assert mean_pass_at_k([[1, 0, 0, 0], [0, 0, 0, 0]], 2) == pytest.approx(expected)


def test_bad_inputs() -> None:
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(4, 1, 5)
    with pytest.raises(ValueError, match="0 <= c <= n"):
        pass_at_k(4, 5, 1)
    with pytest.raises(TypeError, match="k must be an int"):
        pass_at_k(4, 1, 1.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="no problems"):
        avg_at_k([])
    with pytest.raises(ValueError, match="row 1"):
        avg_at_k([[1], [0.5]])


def test_report_table(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    aime = [[1] * 8 + [0] * 56, [0] * 64]  # 64 samples: pass@8..64 reported
    rows = {
        "GRPO": benchmark_scores({"math500": [[1], [0], [1], [1]], "aime24": aime}),
        "OPEFO": benchmark_scores({"aime24": [[1] * 64, [0] * 64], "minerva": [[1], [1]]}),
    }
    md_path, json_path = write_report(rows, tmp_path)
    printed = capsys.readouterr().out
    markdown = md_path.read_text()
    assert printed == markdown
    lines = markdown.splitlines()
    assert lines[0] == "| Method | AIME24 | MATH500 | Minerva | Avg. |"
    assert lines[2] == "| GRPO | 6.2 | 75.0 | – | 40.6 |"
    assert lines[3] == "| OPEFO | 50.0 | – | 100.0 | 75.0 |"
    header = lines.index("| Method | Pass@8 | Pass@16 | Pass@32 | Pass@64 |")
    assert lines[header - 2] == "pass@k on AIME24"
    grpo_pass = [f"{100 * pass_at_k(64, 8, k) / 2:.1f}" for k in (8, 16, 32, 64)]
    assert lines[header + 2] == "| GRPO | " + " | ".join(grpo_pass) + " |"
    assert lines[header + 3] == "| OPEFO | 50.0 | 50.0 | 50.0 | 50.0 |"
    data = json.loads(json_path.read_text())
    assert data["GRPO"]["benchmarks"]["aime24"]["avg_at_k"] == pytest.approx(8 / 128)
    assert data["GRPO"]["benchmarks"]["aime24"]["pass_at_k"]["64"] == pytest.approx(0.5)
    assert data["OPEFO"]["average"] == pytest.approx(0.75)


@pytest.mark.parametrize("verifier", ["dapo", "answer", "math_verify"])
def test_report_names_the_verifier(tmp_path: Path, verifier: str) -> None:
    aime = [[1] * 8 + [0] * 56, [0] * 64]
    rows = {"GRPO": benchmark_scores({"aime24": aime, "math500": [[1], [0]]})}
    md_path, json_path = write_report(rows, tmp_path, verifier=verifier)
    lines = md_path.read_text().splitlines()
    assert lines[0] == f"avg@k, verifier {verifier}"
    assert lines[2] == "| Method | AIME24 | MATH500 | Avg. |"
    assert f"pass@k on AIME24, verifier {verifier}" in lines
    assert json.loads(json_path.read_text())["GRPO"]["verifier"] == verifier


def test_pass_k_sizes_are_the_powers_of_two_below_n_and_n() -> None:
    assert pass_k_sizes(32) == [1, 2, 4, 8, 16, 32]
    assert pass_k_sizes(6) == [1, 2, 4, 6]
    assert pass_k_sizes(1) == [1]
    assert pass_k_sizes(2) == [1, 2]
    for n in range(1, 70):
        expected = [k for k in range(1, n + 1) if k == n or (k & (k - 1) == 0)]
        assert pass_k_sizes(n) == expected, n
    with pytest.raises(ValueError, match="n >= 1"):
        pass_k_sizes(0)


def test_sample_metrics_equal_brute_force_over_the_raw_samples() -> None:
    """Training validation's avg@n and pass@k from a [problems][n] matrix, against the fraction
    of all k-subsets of each problem's own samples (not only the count) holding a correct one."""
    rng = random.Random(2)
    n = 8
    matrix = [[rng.random() < p for _ in range(n)] for p in (0.0, 0.05, 0.3, 0.6, 1.0, 0.15)]
    got = sample_metrics(matrix)
    assert sorted(got) == sorted(["avg@8", "pass@1", "pass@2", "pass@4", "pass@8"])
    for k in (1, 2, 4, 8):
        per_problem = []
        for row in matrix:
            subsets = list(itertools.combinations(row, k))
            per_problem.append(Fraction(sum(any(s) for s in subsets), len(subsets)))
        assert got[f"pass@{k}"] == float(sum(per_problem) / len(matrix)), k
    # a mean of per-problem means of 0/1 values: one rounding per problem and per sum term
    rel = (2 * len(matrix) + 2) * sys.float_info.epsilon
    assert got["avg@8"] == pytest.approx(sum(map(sum, matrix)) / (n * len(matrix)), rel=rel)
    with pytest.raises(ValueError, match="same number of samples"):
        sample_metrics([[1, 0], [1]])
