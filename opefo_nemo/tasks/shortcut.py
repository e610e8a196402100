"""The shortcut task: the embedded additions, where a common shortcut caps the reward.

The problems and the verifier are the arithmetic task's (:mod:`.arithmetic`). Its warm start
writes most solutions as a *shortcut*: the columns added from the top down, each without the
carry from the column below, the top sum written in full and the others' units digits after it::

    "42+35="  →  "4+3=7 2+5=7 =77"        (right: no column carries)
    "47+38="  →  "4+3=7 7+8=15 =75"       (wrong: 7 + 8 carries into the tens)

and only a few in full, from the units up with the carries (:func:`.arithmetic.worked_solution`:
``"7+8=15 4+3+1=8 =85"``), which is right on every problem but written with frequent slips. The
first token already chooses the strategy (the top digit or the units digit of ``a``). The
shortcut is right exactly on the problems where no column but the top one carries: on two-digit
problems the 55 of the 100 units pairs whose sum is below 10. A policy that keeps to the
shortcut can reach at most that fraction (:func:`shortcut_ceiling`); the task's optimum is 1,
the worked solution without slips, which the warm start writes rarely and badly, so reaching it
takes exploring the rare strategy (docs/training.md).
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
    """The mean reward of the best policy that only writes shortcuts, over ``pairs``."""
    return sum(shortcut_is_right(a, b) for a, b in pairs) / len(pairs)
