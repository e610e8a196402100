"""The embedded default's synthetic task: integer arithmetic with exactly verifiable answers.

A problem is ``"a+b="`` (or ``-``, ``*``) with ``0 <= a, b <= max_operand``; the expected response
is the decimal result and end-of-sequence, e.g. ``"12+7="`` → ``"19"``. Every character is in the
tiny model's alphabet (:data:`opefo_nemo.models.tiny.ALPHABET`), one token each. Problems are
drawn with a seeded generator, so the training and validation sets are the same on every machine;
the validation problems are disjoint from the training ones.
"""

from __future__ import annotations

import random
import re

from ..data.problem import Problem, prompt_id_for
from ..rewards.result import CORRECT, NO_ANSWER, WRONG, RewardConfig, RewardResult

SOURCE = "arithmetic"
_INTEGER = re.compile(r"^\s*(-?\d+)\s*$")
_OPERATIONS = {"+": lambda a, b: a + b, "-": lambda a, b: a - b, "*": lambda a, b: a * b}


def problem_text(a: int, operator: str, b: int) -> str:
    return f"{a}{operator}{b}="


def make_problems(
    max_operand: int, operators: str, num_train: int, num_validation: int, seed: int
) -> tuple[list[Problem], list[Problem]]:
    """``num_train`` training and ``num_validation`` validation problems, disjoint, drawn without
    replacement from all ``(a, op, b)`` triples (fewer if the space is smaller)."""
    triples = [
        (a, op, b)
        for op in operators
        for a in range(max_operand + 1)
        for b in range(max_operand + 1)
    ]
    random.Random(seed).shuffle(triples)
    if num_validation + 1 > len(triples):
        raise ValueError(
            f"data.arithmetic: only {len(triples)} distinct problems; num_validation "
            f"({num_validation}) leaves none for training"
        )
    validation = triples[:num_validation]
    train = triples[num_validation : num_validation + num_train]

    def problem(a: int, op: str, b: int) -> Problem:
        text = problem_text(a, op, b)
        answer = str(_OPERATIONS[op](a, b))
        return Problem(prompt_id_for(SOURCE, text, answer), text, answer, SOURCE)

    return [problem(*t) for t in train], [problem(*t) for t in validation]


def score_integer(
    response: str, ground_truth: str, config: RewardConfig | None = None
) -> RewardResult:
    """Exact integer match of the whole (whitespace-stripped) response, scored by ``config``
    (default: 1 for correct, 0 otherwise).

    A response that is not a single integer is ``no_answer``; a different integer is ``wrong``.
    """
    config = config if config is not None else RewardConfig(wrong_score=0.0)
    match = _INTEGER.match(response)
    if match is None:
        return RewardResult(config.score_for(NO_ANSWER), None, NO_ANSWER)
    answer = str(int(match.group(1)))
    reason = CORRECT if answer == str(int(ground_truth)) else WRONG
    return RewardResult(config.score_for(reason), answer, reason)
