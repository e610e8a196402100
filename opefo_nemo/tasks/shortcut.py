"""The shortcut task: the embedded additions, where a common shortcut (top column first, no carries)
caps the reward below the worked solution's 1, so reaching the optimum takes exploring the rare
strategy (docs/studies/shortcut_task.md, "A task where collapse costs reward").
"""

from __future__ import annotations

import random
from collections.abc import Sequence


def column_sums(a: int, b: int) -> list[int]:
    """The digit sums of each column of ``a + b``, units first, without carries."""
    digits_a, digits_b = str(a)[::-1], str(b)[::-1]
    width = max(len(digits_a), len(digits_b))
    return [
        (int(digits_a[i]) if i < len(digits_a) else 0)
        + (int(digits_b[i]) if i < len(digits_b) else 0)
        for i in range(width)
    ]


def shortcut_answer(
    a: int,
    b: int,
    slip_rate: float = 0.0,
    rng: random.Random | None = None,
    *,
    slips: tuple[int, ...] = (-1,),
) -> str:
    """The shortcut's response: one step ``"x+y=s"`` per column from the top down, no carry
    anywhere, then ``"=<answer>"``, the top column's sum in full followed by the units digit of
    every lower column's sum.

    With ``slip_rate > 0`` each column's sum is, with that probability, off by a slip drawn
    uniformly from those of ``slips`` that keep it within ``0..18`` (as in
    :func:`.arithmetic.worked_solution`), and the answer follows it. A rate of 0 draws nothing
    from ``rng``.
    """
    if slip_rate and rng is None:
        raise ValueError("shortcut_answer: slip_rate > 0 needs an rng")
    width = max(len(str(a)), len(str(b)))
    digits_a, digits_b = str(a).zfill(width), str(b).zfill(width)
    steps, sums = [], []
    for x, y in zip(digits_a, digits_b, strict=True):
        total = int(x) + int(y)
        if slip_rate and rng is not None and rng.random() < slip_rate:
            possible = [d for d in slips if 0 <= total + d <= 18]
            total += rng.choice(possible) if possible else 0
        steps.append(f"{x}+{y}={total} ")
        sums.append(total)
    return "".join(steps) + "=" + str(sums[0]) + "".join(str(s % 10) for s in sums[1:])


def shortcut_is_right(a: int, b: int) -> bool:
    """Whether the slip-free shortcut answers ``a + b`` right: no column but the top one
    carries."""
    return all(total < 10 for total in column_sums(a, b)[:-1])


def shortcut_ceiling(pairs: Sequence[tuple[int, int]]) -> float:
    """The mean reward of the best policy that only writes shortcuts, over ``pairs``: on two-digit
    problems the 55 of the 100 units pairs whose sum is below 10."""
    return sum(shortcut_is_right(a, b) for a, b in pairs) / len(pairs)
