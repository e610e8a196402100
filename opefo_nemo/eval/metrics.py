"""avg@k and the unbiased pass@k of spec §7, and the k at which training validation reports them.

pass@k from n samples with c correct is `1 − C(n−c, k) / C(n, k)`: the probability that a
uniformly drawn k-subset of the n samples holds at least one correct one. It is computed with
exact integers and one final rounding to float, so it is exact for any n.
"""

from __future__ import annotations

from collections.abc import Sequence
from fractions import Fraction
from math import comb

CorrectMatrix = Sequence[Sequence[bool | int | float]]


def check_counts(function: str, n: int, c: int, k: int, least_k: int) -> None:
    """``n``, ``c``, ``k`` are ints (not bools) with ``0 ≤ c ≤ n`` and ``least_k ≤ k ≤ n``; else
    a :class:`TypeError` or :class:`ValueError` naming ``function`` and the argument."""
    for name, value in (("n", n), ("c", c), ("k", k)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise TypeError(f"{function}: {name} must be an int, got {value!r}")
    if not 0 <= c <= n:
        raise ValueError(f"{function}: need 0 <= c <= n, got n={n}, c={c}")
    if not least_k <= k <= n:
        raise ValueError(f"{function}: need {least_k} <= k <= n, got n={n}, k={k}")


def pass_at_k_fraction(n: int, c: int, k: int) -> Fraction:
    """The exact pass@k = 1 − C(n−c, k)/C(n, k) for n samples with c correct, 1 ≤ k ≤ n."""
    check_counts("pass_at_k", n, c, k, least_k=1)
    return 1 - Fraction(comb(n - c, k), comb(n, k))


def pass_at_k(n: int, c: int, k: int) -> float:
    """pass@k as a float (correctly rounded from the exact fraction)."""
    return float(pass_at_k_fraction(n, c, k))


def _rows(correct_matrix: CorrectMatrix) -> list[list[float]]:
    rows = [[float(x) for x in row] for row in correct_matrix]
    if not rows:
        raise ValueError("correct_matrix has no problems (rows)")
    for i, row in enumerate(rows):
        if not row:
            raise ValueError(f"correct_matrix row {i} has no samples")
        if any(x not in (0.0, 1.0) for x in row):
            raise ValueError(f"correct_matrix row {i} must hold 0/1 (or bool) values")
    return rows


def avg_at_k(correct_matrix: CorrectMatrix) -> float:
    """avg@k: mean over problems of the fraction of correct samples.

    correct_matrix: one row per problem, one 0/1 entry per sample ([problems][k]; rows may
    differ in length, each problem then weighs the same).
    """
    rows = _rows(correct_matrix)
    return sum(sum(row) / len(row) for row in rows) / len(rows)


def mean_pass_at_k(correct_matrix: CorrectMatrix, k: int) -> float:
    """pass@k averaged over problems, each row being that problem's n ≥ k samples."""
    rows = _rows(correct_matrix)
    total = sum((pass_at_k_fraction(len(row), int(sum(row)), k) for row in rows), start=Fraction(0))
    return float(total / len(rows))


def pass_k_sizes(n: int) -> list[int]:
    """The k of the pass@k that n samples per problem report during training (spec §7): every
    power of two below n, and n itself (n = 32: 1, 2, 4, 8, 16, 32; n = 6: 1, 2, 4, 6)."""
    if n < 1:
        raise ValueError(f"pass_k_sizes: need n >= 1 samples, got {n}")
    sizes = [1 << i for i in range(n.bit_length()) if 1 << i < n]
    return [*sizes, n]


def sample_metrics(correct_matrix: CorrectMatrix) -> dict[str, float]:
    """``avg@n`` and ``pass@k`` for each k of :func:`pass_k_sizes` from a [problems][n] 0/1
    matrix whose rows all hold the same n samples."""
    lengths = {len(row) for row in correct_matrix}
    if len(lengths) != 1:
        raise ValueError(f"every problem needs the same number of samples, got {sorted(lengths)}")
    (n,) = lengths
    metrics = {f"avg@{n}": avg_at_k(correct_matrix)}
    metrics.update({f"pass@{k}": mean_pass_at_k(correct_matrix, k) for k in pass_k_sizes(n)})
    return metrics
