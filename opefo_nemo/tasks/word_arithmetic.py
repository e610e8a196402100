"""Additions asked in words, for a pretrained chat model: ``"What is 3 + 5?"`` → ``"8"``, scored by
the last integer of the response (docs/rewards_data_eval.md, "Verifiers").
"""

from __future__ import annotations

import re

from opefo_nemo.data.problem import Problem, prompt_id_for
from opefo_nemo.rewards.result import CORRECT, NO_ANSWER, WRONG, RewardConfig, RewardResult
from opefo_nemo.tasks.arithmetic import operand_pairs

SOURCE = "word_arithmetic"
_INTEGER = re.compile(r"-?\d+")


def question(a: int, b: int) -> str:
    return f"What is {a} + {b}?"


def make_word_problems(
    digits: int, num_train: int, num_validation: int, seed: int
) -> tuple[list[Problem], list[Problem]]:
    """Training and validation questions of :func:`.arithmetic.operand_pairs` (the
    ``data.arithmetic`` settings; one digit gives the 100 pairs 0..9 × 0..9), each the user's
    message in the model's chat template (``data.template: raw``)."""

    def problem(a: int, b: int) -> Problem:
        text, answer = question(a, b), str(a + b)
        return Problem(prompt_id_for(SOURCE, text, answer), text, answer, SOURCE)

    train, validation = operand_pairs(digits, num_train, num_validation, seed)
    return [problem(*p) for p in train], [problem(*p) for p in validation]


def score_last_number(
    response: str, ground_truth: str, config: RewardConfig | None = None
) -> RewardResult:
    """Score the last integer of ``response`` against ``ground_truth`` (1 / 0 by default): "3 + 5 =
    8." and "The sum is 8" are right, "8 + 1 = 9" is wrong, a response without a number has no
    answer."""
    config = config if config is not None else RewardConfig(wrong_score=0.0)
    numbers = _INTEGER.findall(response)
    if not numbers:
        return RewardResult(config.score_for(NO_ANSWER), None, NO_ANSWER)
    answer = str(int(numbers[-1]))
    reason = CORRECT if answer == str(int(ground_truth)) else WRONG
    return RewardResult(config.score_for(reason), answer, reason)
