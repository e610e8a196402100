"""The reasoning-boundary statistics of spec §12: pass@k of one problem in log space, the k a
comparison reports, the paired bootstrap over problems of a difference between two models, the
problems only one of them solves, and the distinct final answers of a problem's samples.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from opefo_nemo.eval.metrics import check_counts

#: The interval a comparison reports: the central 95 % of the bootstrap distribution.
CONFIDENCE = 0.95


def log_pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k of one problem with ``c`` correct among ``n`` samples, 1 − C(n − c, k) / C(n, k),
    from the log of the ratio, ``lgamma(n−c+1) − lgamma(n−c−k+1) − lgamma(n+1) + lgamma(n−k+1)``:
    no binomial coefficient is formed, so any n costs the same, and the value is within a few
    u₆₄ × Σ|lgamma| of the exact one (about 1e-12 at n = 1024). 1 exactly when n − c < k (every
    k-subset holds a correct sample), 0 exactly when c = 0 or k = 0."""
    check_counts("log_pass_at_k", n, c, k, least_k=0)
    if n - c < k:
        return 1.0
    if c == 0 or k == 0:
        return 0.0
    log_ratio = (
        math.lgamma(n - c + 1)
        - math.lgamma(n - c - k + 1)
        - math.lgamma(n + 1)
        + math.lgamma(n - k + 1)
    )
    return -math.expm1(min(log_ratio, 0.0))


def boundary_ks(n: int, largest: int | None = None) -> list[int]:
    """The k of a comparison from ``n`` samples per problem: 1, 2, 4, … up to ``n / 2`` (spec
    §12: an estimate at k close to n rests on few distinct k-subsets), and up to ``largest`` when
    it is given (it must be a k that n allows)."""
    if n < 2:
        raise ValueError(f"a boundary comparison needs n >= 2 samples per problem, got {n}")
    if largest is not None and not 1 <= largest <= n // 2:
        raise ValueError(f"k = {largest} needs n >= {2 * largest} samples per problem, got {n}")
    top = n // 2 if largest is None else largest
    return [1 << i for i in range(top.bit_length()) if 1 << i <= top]


def problem_pass_at_k(counts: Sequence[int], n: int, k: int) -> list[float]:
    """pass@k of every problem, from its count of correct samples among ``n``."""
    return [log_pass_at_k(n, c, k) for c in counts]


def mean(values: Sequence[float]) -> float:
    """The mean over problems (math.fsum: the same value whatever the order)."""
    if not values:
        raise ValueError("the mean of no problems")
    return math.fsum(values) / len(values)


def percentile(values: Iterable[float], q: float) -> float:
    """The ``q``-quantile (0 ≤ q ≤ 1) of ``values`` by linear interpolation between order
    statistics: sorted x_0 ≤ … ≤ x_{B−1}, position h = (B − 1) q, x_⌊h⌋ + (h − ⌊h⌋)(x_⌊h⌋+1 −
    x_⌊h⌋) (Hyndman and Fan's type 7, numpy's default)."""
    ordered = sorted(values)
    if not ordered:
        raise ValueError("the percentile of no values")
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"a quantile must be in [0, 1], got {q}")
    h = (len(ordered) - 1) * q
    low = math.floor(h)
    if low + 1 >= len(ordered):
        return ordered[-1]
    return ordered[low] + (h - low) * (ordered[low + 1] - ordered[low])


def resample_indices(problems: int, resamples: int, seed: int) -> list[list[int]]:
    """``resamples`` bootstrap draws of ``problems`` problem indices each, with replacement, from
    a ``random.Random(seed)``: the same seed gives the same draws, so every model and every pair
    of a comparison is resampled with the same problems."""
    if problems < 1 or resamples < 1:
        raise ValueError(f"need >= 1 problems and resamples, got {problems} and {resamples}")
    rng = random.Random(seed)
    population = range(problems)
    return [rng.choices(population, k=problems) for _ in range(resamples)]


@dataclass(frozen=True)
class Estimate:
    """A mean over problems and the percentile interval of its bootstrap distribution."""

    value: float
    low: float
    high: float


@dataclass(frozen=True)
class PairedEstimate:
    """Model A's and model B's mean over the same problems, and the difference B − A; each with
    its interval from the same resamples (the pair is resampled together)."""

    a: Estimate
    b: Estimate
    delta: Estimate


def _interval(values: Sequence[float], draws: Sequence[Sequence[int]]) -> Estimate:
    tail = (1.0 - CONFIDENCE) / 2
    means = [math.fsum(values[i] for i in draw) / len(draw) for draw in draws]
    return Estimate(mean(values), percentile(means, tail), percentile(means, 1.0 - tail))


def paired_bootstrap(
    values_a: Sequence[float], values_b: Sequence[float], draws: Sequence[Sequence[int]]
) -> PairedEstimate:
    """The paired bootstrap of spec §12 over per-problem values (pass@k_i of each model, in the
    same problem order): each draw of :func:`resample_indices` picks problems, both models'
    values on those problems are averaged, and their difference is one draw of Δ; the interval
    is the central :data:`CONFIDENCE` of the draws (:func:`percentile`). The point values are
    the means over the problems as they are."""
    if len(values_a) != len(values_b):
        raise ValueError(
            f"paired values need the same problems: {len(values_a)} and {len(values_b)}"
        )
    differences = [b - a for a, b in zip(values_a, values_b, strict=True)]
    return PairedEstimate(
        _interval(values_a, draws), _interval(values_b, draws), _interval(differences, draws)
    )


def only_solved(counts_a: Sequence[int], counts_b: Sequence[int]) -> tuple[list[int], list[int]]:
    """The indices of the problems only A solves (c > 0 for A, c = 0 for B) and of those only B
    solves, each in problem order."""
    if len(counts_a) != len(counts_b):
        raise ValueError(
            f"paired counts need the same problems: {len(counts_a)} and {len(counts_b)}"
        )
    pairs = list(enumerate(zip(counts_a, counts_b, strict=True)))
    only_a = [i for i, (a, b) in pairs if a > 0 and b == 0]
    only_b = [i for i, (a, b) in pairs if b > 0 and a == 0]
    return only_a, only_b


def distinct_answers(answers: Iterable[str | None]) -> int:
    """How many different final answers the samples of one problem gave (the verifier's
    extracted, normalised answer; a sample without one counts for none)."""
    return len({answer for answer in answers if answer is not None})
