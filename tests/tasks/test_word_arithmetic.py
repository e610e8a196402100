"""The word-problem task of the real-model preset: questions, answers and the ``last_number``
verifier, against Python's own sums and hand-written responses."""

from __future__ import annotations

import re

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.tasks.word_arithmetic import make_word_problems, score_last_number
from opefo_nemo.trainer.scoring import score_responses
from opefo_nemo.trainer.setup import generated_split

SUM = re.compile(r"^What is (\d+) \+ (\d+)\?$")
PRODUCT = re.compile(r"^What is (\d+) \* (\d+)\?$")


def asked_pairs(problems, question, result):
    """The operand pairs the problems ask, sorted, each answer checked against ``result(a, b)``
    computed here."""
    pairs = []
    for problem in problems:
        a, b = map(int, question.match(problem.problem).groups())
        assert problem.ground_truth == str(result(a, b))
        pairs.append((a, b))
    return sorted(pairs)


def all_pairs(n):
    return [(a, b) for a in range(n) for b in range(n)]


def test_one_digit_questions_cover_all_pairs_once_and_answer_with_the_sum():
    train, validation = make_word_problems(1, 90, 10, seed=1234)
    assert len(train) == 90 and len(validation) == 10
    assert asked_pairs(train + validation, SUM, lambda a, b: a + b) == all_pairs(10)
    assert make_word_problems(1, 90, 10, seed=1234) == (train, validation)
    assert make_word_problems(1, 90, 10, seed=5)[1] != validation


def test_products_ask_every_pair_once_and_answer_with_the_product():
    train, validation = make_word_problems(1, 90, 10, seed=1234, operation="multiply")
    assert asked_pairs(train + validation, PRODUCT, lambda a, b: a * b) == all_pairs(10)
    sums = make_word_problems(1, 90, 10, seed=1234)
    assert [p.problem.replace("+", "*") for p in sums[1]] == [p.problem for p in validation]


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        (["data.arithmetic.operation=multiply"], "operation is 'multiply'"),
        (["data.arithmetic.max_operand=12"], "max_operand is 12"),
        (["+preset=smollm2_cpu", "data.arithmetic.operation=divide"], "operation is 'divide'"),
        (["+preset=smollm2_cpu", "data.arithmetic.max_operand=0"], "max_operand (0)"),
    ],
)
def test_questions_the_task_cannot_ask_are_refused_naming_the_key(overrides, message):
    with pytest.raises(ValueError, match=re.escape(f"data.arithmetic.{message}")):
        compose(overrides)


def test_the_times_tables_ask_every_pair_to_twelve_once():
    config, _ = compose(["+preset=smollm2_cpu", "data=word_times_tables"])
    train, validation = generated_split("word_arithmetic", config.data)
    assert (len(train), len(validation)) == (145, 24)
    assert asked_pairs(train + validation, PRODUCT, lambda a, b: a * b) == all_pairs(13)
    assert config.reward.verifier == "last_number"


def test_the_preset_with_products_trains_and_validates_on_products():
    config, _ = compose(["+preset=smollm2_cpu", "data.arithmetic.operation=multiply"])
    train, validation = generated_split("word_arithmetic", config.data)
    assert (len(train), len(validation)) == (90, 10)
    assert asked_pairs(train + validation, PRODUCT, lambda a, b: a * b) == all_pairs(10)


@pytest.mark.parametrize(
    ("response", "reason", "answer"),
    [
        ("3 + 5 = 8.", "correct", "8"),
        ("The sum of 3 and 5 is 8", "correct", "8"),
        ("To add 3 and 5 you get 8, so the answer is 8!", "correct", "8"),
        ("3 + 5 = 8, and 8 + 1 = 9", "wrong", "9"),
        ("So 5 + 3 equals 15.", "wrong", "15"),
        ("It is eight.", "no_answer", None),
        ("", "no_answer", None),
    ],
)
def test_last_number_reads_the_last_integer(response, reason, answer):
    result = score_last_number(response, "8")
    assert (result.reason, result.answer, result.score) == (
        reason,
        answer,
        float(reason == "correct"),
    )


def test_the_preset_scores_with_last_number():
    config, _ = compose(["+preset=smollm2_cpu"])
    assert (config.reward.verifier, config.data.train) == ("last_number", "word_arithmetic")
    results = score_responses(["3 + 5 = 8", "9"], ["8", "8"], config.reward)
    assert [r.score for r in results] == [1.0, 0.0]
