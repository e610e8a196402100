"""The boundary statistics of spec §12 against independent references: pass@k against exact
enumeration of k-subsets and exact fractions, the percentile against its hand-worked definition,
the paired bootstrap against the enumeration of every resample of two and three problems and
against the bootstrap variance's closed form, the only-A / only-B problems of a fixed sample set."""

from __future__ import annotations

import itertools
import math
import random
from collections import Counter
from fractions import Fraction

import pytest

from opefo_nemo.eval.boundary import (
    Estimate,
    boundary_ks,
    distinct_answers,
    log_pass_at_k,
    mean,
    only_solved,
    paired_bootstrap,
    percentile,
    problem_pass_at_k,
    resample_indices,
)
from opefo_nemo.eval.metrics import pass_at_k_fraction

U64 = 2.0**-53


def enumerated_pass_at_k(n: int, c: int, k: int) -> Fraction:
    """The share of the k-subsets of n samples (the first c correct) holding a correct one."""
    subsets = list(itertools.combinations(range(n), k))
    return Fraction(sum(any(i < c for i in s) for s in subsets), len(subsets))


def log_space_bound(n: int, c: int, k: int) -> float:
    """The rounding of the log-space estimate: four lgamma values of relative error a few u₆₄
    (4 u taken; 0.3 u was the largest seen over n ≤ 4096), three additions of at most their sum
    L = Σ|lgamma| each (u L), expm1 and the final subtraction (2 u): 7 u L + 2 u."""
    if n - c < k or c == 0 or k == 0:  # no lgamma: exactly 1 or 0
        return 0.0
    terms = (n - c + 1, n - c - k + 1, n + 1, n - k + 1)
    return 7 * U64 * sum(abs(math.lgamma(t)) for t in terms) + 2 * U64


@pytest.mark.parametrize("n", [1, 2, 3, 5, 8, 11])
def test_pass_at_k_matches_the_enumeration_of_k_subsets(n):
    for c in range(n + 1):
        for k in range(n + 1):
            exact = enumerated_pass_at_k(n, c, k) if k else Fraction(0)
            got = log_pass_at_k(n, c, k)
            assert abs(Fraction(got) - exact) <= log_space_bound(n, c, k), (n, c, k, got)
            if n - c < k:  # every k-subset holds a correct sample: exactly 1
                assert got == 1.0
            if c == 0 or k == 0:
                assert got == 0.0


def test_pass_at_k_for_large_n_matches_exact_fractions():
    rng = random.Random(0)
    for _ in range(300):
        n = rng.randint(64, 4096)
        c, k = rng.randint(0, n), rng.randint(1, n // 2)
        exact = pass_at_k_fraction(n, c, k)
        assert abs(Fraction(log_pass_at_k(n, c, k)) - exact) <= log_space_bound(n, c, k)


def test_pass_at_k_refuses_impossible_counts():
    with pytest.raises(ValueError, match="0 <= c <= n"):
        log_pass_at_k(4, 5, 1)
    with pytest.raises(ValueError, match="0 <= k <= n"):
        log_pass_at_k(4, 1, 5)
    with pytest.raises(TypeError, match="must be an int"):
        log_pass_at_k(4, 1.0, 1)  # type: ignore[arg-type]


def test_reported_k_are_the_powers_of_two_up_to_half_of_n():
    assert boundary_ks(256) == [1, 2, 4, 8, 16, 32, 64, 128]
    assert boundary_ks(100) == [1, 2, 4, 8, 16, 32]
    assert boundary_ks(2) == [1]
    assert boundary_ks(256, 16) == [1, 2, 4, 8, 16]
    with pytest.raises(ValueError, match="k = 128 needs n >= 256"):
        boundary_ks(128, 128)
    with pytest.raises(ValueError, match="n >= 2"):
        boundary_ks(1)


def test_percentile_is_linear_between_order_statistics():
    # type 7 by hand: h = (B − 1) q
    values = [3.0, 1.0, 4.0, 1.5]  # sorted 1, 1.5, 3, 4
    assert percentile(values, 0.0) == 1.0
    assert percentile(values, 1.0) == 4.0
    assert percentile(values, 0.5) == 2.25  # h = 1.5: 1.5 + 0.5 (3 − 1.5)
    assert percentile(values, 0.025) == pytest.approx(1.0 + 0.075 * 0.5, rel=4 * U64)
    numpy = pytest.importorskip("numpy")
    rng = random.Random(3)
    draws = [rng.random() for _ in range(101)]
    for q in (0.025, 0.3, 0.975):
        want = float(numpy.percentile(draws, 100 * q))
        assert percentile(draws, q) == pytest.approx(want, rel=4 * U64)


def test_the_interval_of_every_resample_of_two_problems_by_hand():
    # per-problem differences 0 and 1: the four resamples (0,0) (0,1) (1,0) (1,1) have the means
    # 0, 0.5, 0.5, 1; their 2.5 % point is 0 + 0.075 × 0.5, the 97.5 % one 0.5 + 0.925 × 0.5
    every = [list(draw) for draw in itertools.product(range(2), repeat=2)]
    result = paired_bootstrap([0.25, 0.5], [0.25, 1.5], every)
    assert result.delta.value == 0.5
    assert result.delta.low == pytest.approx(0.0375, rel=4 * U64)
    assert result.delta.high == pytest.approx(0.9625, rel=4 * U64)
    assert result.a.value == 0.375 and result.b.value == 0.875


def test_seeded_resamples_of_three_problems_follow_the_exact_bootstrap_distribution():
    # the 27 equally likely resamples of 3 problems: each resampled mean's frequency over B seeded
    # draws is binomial around its exact probability (within 5 standard deviations)
    values = [0.0, 1.0, 3.0]
    exact = Counter(sum(values[i] for i in d) / 3 for d in itertools.product(range(3), repeat=3))
    draws = resample_indices(3, 20000, seed=7)
    seen = Counter(sum(values[i] for i in d) / 3 for d in draws)
    assert set(seen) <= set(exact)
    for value, ways in exact.items():
        p = ways / 27
        sd = math.sqrt(len(draws) * p * (1 - p))
        assert abs(seen[value] - len(draws) * p) <= 5 * sd, (value, seen[value])
    assert resample_indices(3, 5, seed=7) == draws[:5]  # the seed fixes the draws


def test_bootstrap_variance_matches_its_closed_form():
    # the bootstrap mean of m problems has variance σ²/m, σ² = (1/m) Σ (d_i − d̄)²; the sample
    # variance of B draws is within 5 of its standard errors, √(2/(B−1)) σ²/m (normal approx.)
    rng = random.Random(11)
    differences = [rng.choice([-1.0, 0.0, 0.0, 0.5, 1.0]) for _ in range(40)]
    m, resamples = len(differences), 4000
    centre = sum(differences) / m
    closed = sum((d - centre) ** 2 for d in differences) / m / m
    draws = resample_indices(m, resamples, seed=5)
    means = [sum(differences[i] for i in d) / m for d in draws]
    average = sum(means) / resamples
    sample = sum((x - average) ** 2 for x in means) / (resamples - 1)
    assert abs(sample - closed) <= 5 * math.sqrt(2 / (resamples - 1)) * closed


def test_pairing_resamples_both_models_together():
    # B = A + 0.1 on every problem: every paired resample's difference is 0.1, however much the
    # models' own means move; an unpaired bootstrap would give an interval as wide as A's
    a = [0.0, 0.2, 0.9, 0.4, 0.7]
    b = [x + 0.1 for x in a]
    result = paired_bootstrap(a, b, resample_indices(5, 2000, seed=1))
    for bound in (result.delta.value, result.delta.low, result.delta.high):
        assert bound == pytest.approx(0.1, rel=0, abs=8 * U64)
    assert result.a.high - result.a.low > 0.3


def test_only_a_and_only_b_of_a_fixed_sample_set():
    # problems: 0 both solve, 1 only base, 2 neither, 3 only trained, 4 only base, 5 both
    base = [[1, 0, 0], [0, 1, 0], [0, 0, 0], [0, 0, 0], [1, 1, 1], [0, 0, 1]]
    trained = [[1, 1, 1], [0, 0, 0], [0, 0, 0], [1, 0, 0], [0, 0, 0], [1, 0, 1]]
    only_base, only_trained = only_solved([sum(r) for r in base], [sum(r) for r in trained])
    assert only_base == [1, 4]
    assert only_trained == [3]
    with pytest.raises(ValueError, match="same problems: 3 and 2"):
        only_solved([1, 0, 1], [1, 1])


def test_problem_curve_and_mean():
    curve = problem_pass_at_k([0, 1, 4], 4, 2)
    assert curve[0] == 0.0 and curve[2] == 1.0  # c = 0; n − c < k
    assert curve[1] == pytest.approx(0.5, rel=0, abs=log_space_bound(4, 1, 2))  # 1 − 3/6
    assert mean([0.0, 0.5, 1.0]) == 0.5
    with pytest.raises(ValueError, match="no problems"):
        mean([])


def test_distinct_answers_ignore_samples_without_one():
    assert distinct_answers(["42", "41", "42", None, "7"]) == 3
    assert distinct_answers([None, None]) == 0


def test_estimate_holds_the_point_and_its_interval():
    result = paired_bootstrap([1.0], [0.0], [[0]])
    assert result.delta == Estimate(-1.0, -1.0, -1.0)
