"""Additions or products asked in words, for a pretrained chat model: ``"What is 3 + 5?"`` →
``"8"``, ``"What is 3 * 5?"`` → ``"15"``, scored by the last integer of the response
(docs/rewards_data_eval.md, "Verifiers").
"""

from __future__ import annotations

import re

from opefo_nemo.data.problem import Problem, prompt_id_for
from opefo_nemo.rewards.result import CORRECT, NO_ANSWER, WRONG, RewardResult, ScoringConfig
from opefo_nemo.tasks.arithmetic import operand_pairs

SOURCE = "word_arithmetic"
_INTEGER = re.compile(r"-?\d+")


OPERATORS = {"add": ("+", int.__add__), "multiply": ("*", int.__mul__)}
"""Each ``data.arithmetic.operation``: its sign in the question and its result."""


def make_word_problems(
    digits: int,
    num_train: int,
    num_validation: int,
    seed: int,
    operation: str = "add",
    max_operand: int | None = None,
) -> tuple[list[Problem], list[Problem]]:
    """Training and validation questions of :func:`.arithmetic.operand_pairs` (the
    ``data.arithmetic`` settings; one digit gives the 100 pairs 0..9 × 0..9, ``max_operand=12``
    the 169 of the times tables to 12), each the user's message in the model's chat template
    (``data.template: raw``)."""
    sign, result = OPERATORS[operation]

    def problem(a: int, b: int) -> Problem:
        text, answer = f"What is {a} {sign} {b}?", str(result(a, b))
        return Problem(prompt_id_for(SOURCE, text, answer), text, answer, SOURCE)

    train, validation = operand_pairs(digits, num_train, num_validation, seed, max_operand)
    return [problem(*p) for p in train], [problem(*p) for p in validation]


def score_last_number(
    response: str, ground_truth: str, config: ScoringConfig | None = None
) -> RewardResult:
    """Score the last integer of ``response`` against ``ground_truth`` (1 / 0 by default): "3 + 5 =
    8." and "The sum is 8" are right, "8 + 1 = 9" is wrong, a response without a number has no
    answer."""
    config = config if config is not None else ScoringConfig(incorrect_score=0.0)
    numbers = _INTEGER.findall(response)
    if not numbers:
        return RewardResult(config.score_for(NO_ANSWER), None, NO_ANSWER)
    answer = str(int(numbers[-1]))
    reason = CORRECT if answer == str(int(ground_truth)) else WRONG
    return RewardResult(config.score_for(reason), answer, reason)
