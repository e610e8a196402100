"""The embedded default's synthetic task: multi-digit addition written out column by column
(``"47+38="`` → ``"7+8=15 4+3+1=8 =85"``), scored on the final answer only (docs/training.md,
"The embedded default").
"""

from __future__ import annotations

import random
import re

from opefo_nemo.data.problem import Problem, prompt_id_for
from opefo_nemo.rewards.result import CORRECT, NO_ANSWER, WRONG, RewardResult, ScoringConfig

SOURCE = "arithmetic"
_PROMPT = re.compile(r"^(\d+)\+(\d+)=$")
_FINAL = re.compile(r"^=(\d+)$")
SLIPS = (-2, -1, 1, 2)
"""How far a slipped column sum is from the true one (:func:`worked_solution`)."""


def problem_text(a: int, b: int) -> str:
    return f"{a}+{b}="


def operands(prompt: str) -> tuple[int, int]:
    """``(a, b)`` of a prompt ``"a+b="``; ``ValueError`` for anything else."""
    match = _PROMPT.match(prompt)
    if match is None:
        raise ValueError(f"not an addition prompt 'a+b=': {prompt!r}")
    return int(match.group(1)), int(match.group(2))


def worked_solution(
    a: int,
    b: int,
    slip_rate: float = 0.0,
    rng: random.Random | None = None,
    *,
    slips: tuple[int, ...] = SLIPS,
    swap_rate: float = 0.0,
    carry_first_rate: float = 0.0,
    zero_carry_rate: float = 0.0,
    separators: str = "",
    separator_rate: float = 0.0,
) -> str:
    """The column-by-column solution of ``a + b``, without end-of-sequence: the columns from the
    units up, one step per column, the carry in as a third term when there is one, then the sum
    after a lone ``=``::

        "47+38="  →  "7+8=15 4+3+1=8 =85"
        "97+38="  →  "7+8=15 9+3+1=13 =135"

    Step ``i`` (``i = 0`` the units) is ``"{a_i}+{b_i}=s_i"`` or ``"{a_i}+{b_i}+1=s_i"`` with
    ``s_i = a_i + b_i + c_i``, ``c_0 = 0``, ``c_{i+1} = s_i // 10``; the answer is ``s_{d-1}``
    written in full followed by the units digits of ``s_{d-2}, …, s_0``. Every character is in
    the tiny model's alphabet (:data:`opefo_nemo.models.tiny.ALPHABET`), one token each.

    The number of columns is the longer operand's digit count. With ``slip_rate > 0`` each
    column's sum is, with that probability, off by a slip ``δ`` drawn uniformly from those of
    ``slips`` that keep it within ``0..19`` (none: no slip), and the carries and the answer follow
    the slipped sums, as a careless but consistent writer would: the answer is then wrong.
    Harmless choices, each column independently: with probability ``swap_rate`` its two digits
    are written in the other order; a carry is written first with probability
    ``carry_first_rate`` (else last); a column without a carry writes it as ``+0`` with
    probability ``zero_carry_rate``; and each step is followed, with probability
    ``separator_rate``, by one of ``separators`` (uniformly) instead of the space. A rate of 0
    draws nothing from ``rng``. The answer is always after a space (the verifier's field).
    """
    rates = (slip_rate, swap_rate, carry_first_rate, zero_carry_rate, separator_rate)
    if any(rates) and rng is None:
        raise ValueError("worked_solution: a slip or writing-choice rate > 0 needs an rng")
    rng = rng if rng is not None else random.Random(0)  # drawn from only when a rate is > 0
    if separator_rate and not separators:
        raise ValueError("worked_solution: separator_rate > 0 needs separators")
    digits_a, digits_b = str(a)[::-1], str(b)[::-1]
    steps, units, carry = [], [], 0
    width = max(len(digits_a), len(digits_b))
    for i in range(width):
        x = int(digits_a[i]) if i < len(digits_a) else 0
        y = int(digits_b[i]) if i < len(digits_b) else 0
        total = x + y + carry
        if slip_rate and rng.random() < slip_rate:
            possible = [d for d in slips if 0 <= total + d <= 19]
            total += rng.choice(possible) if possible else 0
        terms = [str(y), str(x)] if swap_rate and rng.random() < swap_rate else [str(x), str(y)]
        if carry:
            first = carry_first_rate and rng.random() < carry_first_rate
            terms = ["1", *terms] if first else [*terms, "1"]
        elif zero_carry_rate and rng.random() < zero_carry_rate:
            terms.append("0")
        separator = " "
        if i < width - 1 and separator_rate and rng.random() < separator_rate:
            separator = rng.choice(separators)
        steps.append("+".join(terms) + f"={total}" + separator)
        units.append(str(total % 10))
        carry = total // 10
    answer = str(total) + "".join(reversed(units[:-1]))
    return "".join(steps) + f"={answer}"


def operand_pairs(
    digits: int, num_train: int, num_validation: int, seed: int, max_operand: int | None = None
) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """``num_train`` training and ``num_validation`` validation operand pairs, disjoint, drawn
    without replacement from all pairs of ``digits``-digit operands (fewer if the space is
    smaller; one digit: 0..9), or of operands 0..``max_operand`` when it is given. Seeded, so the
    sets are the same on every machine."""
    low, high = 10 ** (digits - 1) if digits > 1 else 0, 10**digits
    if max_operand is not None:
        low, high = 0, max_operand + 1
    pairs = [(a, b) for a in range(low, high) for b in range(low, high)]
    random.Random(seed).shuffle(pairs)
    if num_validation + 1 > len(pairs):
        raise ValueError(
            f"data.arithmetic: only {len(pairs)} distinct problems; num_validation "
            f"({num_validation}) leaves none for training"
        )
    return pairs[num_validation : num_validation + num_train], pairs[:num_validation]


def make_problems(
    digits: int, num_train: int, num_validation: int, seed: int
) -> tuple[list[Problem], list[Problem]]:
    """Training and validation problems ``"a+b="`` of :func:`operand_pairs`."""

    def problem(a: int, b: int) -> Problem:
        text, answer = problem_text(a, b), str(a + b)
        return Problem(prompt_id_for(SOURCE, text, answer), text, answer, SOURCE)

    train, validation = operand_pairs(digits, num_train, num_validation, seed)
    return [problem(*p) for p in train], [problem(*p) for p in validation]


def score_final_answer(
    response: str, ground_truth: str, config: ScoringConfig | None = None
) -> RewardResult:
    """Score the final answer of a worked solution, scored by ``config`` (default: 1 for correct,
    0 otherwise).

    The answer is the last whitespace-separated field of the response when it is ``=`` followed
    by digits; a response without one (cut off, or malformed) is ``no_answer``; another integer
    than ``ground_truth`` is ``wrong``. The steps before it are not checked.
    """
    config = config if config is not None else ScoringConfig(incorrect_score=0.0)
    fields = response.split()
    match = _FINAL.match(fields[-1]) if fields else None
    if match is None:
        return RewardResult(config.score_for(NO_ANSWER), None, NO_ANSWER)
    answer = str(int(match.group(1)))
    reason = CORRECT if answer == str(int(ground_truth)) else WRONG
    return RewardResult(config.score_for(reason), answer, reason)
