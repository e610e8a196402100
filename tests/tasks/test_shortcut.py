"""The shortcut task: the shortcut's answers against integer arithmetic, its ceiling and the
task's optimum by exhaustive counting, the verifier on both strategies, and the warm start's mix
of strategies, slips and right answers against their brute-force expectations."""

from __future__ import annotations

import random
import sys

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.tasks.arithmetic import make_problems, operands, score_final_answer, worked_solution
from opefo_nemo.tasks.embedded_model import warm_start_response
from opefo_nemo.tasks.shortcut import shortcut_answer, shortcut_ceiling, shortcut_is_right
from opefo_nemo.trainer.inputs import warm_start_recipe
from opefo_nemo.trainer.setup import arithmetic_split


def no_carry_sum(a: int, b: int, digits: int) -> int:
    """``a + b`` with every carry but the top column's dropped, from place values alone."""
    lower = sum(((a // 10**i + b // 10**i) % 10) * 10**i for i in range(digits - 1))
    top = digits - 1
    return lower + (a // 10**top + b // 10**top) * 10**top


@pytest.mark.parametrize(("digits", "ceiling"), [(1, 1.0), (2, 0.55), (3, 0.55**2)])
def test_shortcut_answers_and_their_ceiling_over_every_problem(digits, ceiling):
    """Over all pairs of ``digits``-digit operands: the shortcut writes the carry-free sum, is
    right exactly when that equals the true sum, and is right on the known fraction (55 of the
    100 units pairs sum below 10, and so do the tens of three-digit operands)."""
    low = 10 ** (digits - 1) if digits > 1 else 0
    pairs = [(a, b) for a in range(low, 10**digits) for b in range(low, 10**digits)]
    for a, b in pairs:
        *steps, answer = shortcut_answer(a, b).split(" ")
        assert answer == f"={no_carry_sum(a, b, digits)}"
        top_down = zip(str(a).zfill(digits), str(b).zfill(digits), strict=True)
        assert steps == [f"{x}+{y}={int(x) + int(y)}" for x, y in top_down]
        assert shortcut_is_right(a, b) == (no_carry_sum(a, b, digits) == a + b)
    # a count over a count (one rounding) against 0.55 or its square (three roundings)
    assert shortcut_ceiling(pairs) == pytest.approx(ceiling, rel=4 * sys.float_info.epsilon)


def test_examples():
    assert shortcut_answer(42, 35) == "4+3=7 2+5=7 =77"
    assert shortcut_answer(47, 38) == "4+3=7 7+8=15 =75"
    assert shortcut_answer(97, 38) == "9+3=12 7+8=15 =125"
    assert shortcut_answer(99, 99) == "9+9=18 9+9=18 =188"


def test_verifier_scores_the_strategies_and_the_optimum_is_one():
    """On the task's own problems the verifier gives the slip-free worked solution 1 on every
    problem (the optimum) and the shortcut 1 exactly where no column but the top one carries."""
    config, _ = compose(["model=tiny_shortcut"])
    train, validation = arithmetic_split(config.data)
    for problem in train + validation:
        a, b = operands(problem.problem)
        worked = score_final_answer(worked_solution(a, b), problem.ground_truth)
        assert worked.score == 1.0
        shortcut = score_final_answer(shortcut_answer(a, b), problem.ground_truth)
        assert shortcut.score == float(a % 10 + b % 10 < 10)
        assert shortcut.reason == ("correct" if a % 10 + b % 10 < 10 else "wrong")
    pairs = [operands(p.problem) for p in train]
    assert 0.5 < shortcut_ceiling(pairs) < 0.6  # near the 0.55 of all pairs


def test_shortcut_slips_at_the_rate_only_downwards_and_the_answer_follows():
    rng, rate, columns, slipped = random.Random(3), 0.2, 0, 0
    for _ in range(4000):
        a, b = rng.randrange(10, 100), rng.randrange(10, 100)
        *steps, answer = shortcut_answer(a, b, rate, rng, slips=(-1,)).split(" ")
        written = [int(step.split("=")[1]) for step in steps]
        true = [a // 10 + b // 10, a % 10 + b % 10]
        deltas = [w - t for w, t in zip(written, true, strict=True)]
        assert all(d in (0, -1) for d in deltas) and written[1] >= 0  # 0 cannot be one short
        assert answer == f"={written[0]}{written[1] % 10}"
        columns += 1 + (true[1] > 0)  # the tens' sum is never 0
        slipped += sum(d != 0 for d in deltas)
    assert abs(slipped / columns - rate) < 4 * (rate * (1 - rate) / columns) ** 0.5
    with pytest.raises(ValueError, match="rng"):
        shortcut_answer(12, 34, 0.5)


def p_right(a: int, b: int, slip_rate: float, carries: bool) -> float:
    """The chance a one-short slip leaves the answer right: none, so the chance of no slip at any
    column whose sum can be one short (it is above 0); with ``carries`` the sums carry."""
    p, carry = 1.0, 0
    for i in range(2):
        total = (a // 10**i) % 10 + (b // 10**i) % 10 + (carry if carries else 0)
        p *= 1 - slip_rate if total > 0 else 1.0
        carry = total // 10
    return p


def test_warm_start_mix_of_strategies_slips_and_right_answers():
    """The warm start's responses, drawn as its supervised phase draws them: shortcuts at
    ``model.warm_start.shortcut_rate``, and each strategy right as often as brute-force counting
    over the drawn problems says, within 4 binomial standard deviations."""
    config, _ = compose(["model=tiny_shortcut"])
    m = config.model.warm_start
    train, _ = make_problems(2, 2000, 64, config.data.arithmetic.seed)
    # where the two digits of a differ, the first token tells the strategies apart
    pool = [operands(p.problem) for p in train if p.problem[0] != p.problem[1]]
    rng, n = random.Random(11), 40000
    count = {"shortcut": 0, "worked": 0}
    right = {"shortcut": 0, "worked": 0}
    expected = {"shortcut": 0.0, "worked": 0.0}
    for _ in range(n):
        a, b = pool[rng.randrange(len(pool))]
        response = warm_start_response(a, b, m, rng)
        kind = "shortcut" if response[0] == str(a // 10) else "worked"
        count[kind] += 1
        right[kind] += score_final_answer(response, str(a + b)).score == 1.0
        if kind == "shortcut":
            expected[kind] += shortcut_is_right(a, b) * p_right(a, b, m.shortcut_slip_rate, False)
        else:
            expected[kind] += p_right(a, b, m.slip_rate, True)
    rate = m.shortcut_rate
    assert abs(count["shortcut"] / n - rate) < 4 * (rate * (1 - rate) / n) ** 0.5
    for kind in count:
        p = expected[kind] / count[kind]
        assert abs(right[kind] / count[kind] - p) < 4 * (p * (1 - p) / count[kind]) ** 0.5
    # by construction the rare strategy starts out worse than the common one
    assert expected["worked"] / count["worked"] < expected["shortcut"] / count["shortcut"]


def test_recipe_records_the_shortcut_only_where_it_is_written():
    """The other tasks' warm-start recipes (and so their caches) do not change."""
    plain = warm_start_recipe(compose([])[0])
    shortcut = warm_start_recipe(compose(["model=tiny_shortcut"])[0])
    assert not any(key.startswith("shortcut") for key in plain)
    assert shortcut["shortcut_rate"] == 0.95 and shortcut["shortcut_slip_rate"] == 0.2
