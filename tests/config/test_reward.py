"""The ``reward`` section: each verifier's default scale, ``reward.incorrect_score``, the overlong
shaping keys and their validation."""

from __future__ import annotations

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.config.reward import RewardConfig
from opefo_nemo.trainer.scoring import overlong_penalties, score_responses

RESPONSES = ["Answer: 3", "Answer: 4", "no answer at all"]
TRUTHS = ["3", "3", "3"]


@pytest.mark.parametrize(
    ("verifier", "incorrect_score", "expected"),
    [
        ("dapo", None, [1.0, -1.0, -1.0]),  # the DAPO rule's scale
        ("dapo", 0.0, [1.0, 0.0, 0.0]),
        ("answer", None, [1.0, 0.0, 0.0]),
        ("answer", -1.0, [1.0, -1.0, -1.0]),
        ("math_verify", None, [1.0, 0.0, 0.0]),
    ],
)
def test_incorrect_score_sets_the_scale(verifier, incorrect_score, expected):
    settings = RewardConfig(verifier=verifier, incorrect_score=incorrect_score)
    assert [r.score for r in score_responses(RESPONSES, TRUTHS, settings)] == expected


def test_arithmetic_task_scores_one_zero_unless_told():
    responses, truths = ["3+4=7 =7", "3+4=8 =8", "3+4=7"], ["7", "7", "7"]
    default = score_responses(responses, truths, RewardConfig())
    assert [r.score for r in default] == [1.0, 0.0, 0.0]
    signed = score_responses(responses, truths, RewardConfig(incorrect_score=-1.0))
    assert [r.score for r in signed] == [1.0, -1.0, -1.0]


def test_overlong_penalties_follow_the_settings():
    lengths = [0, 6, 7, 8, 9, 10]
    assert overlong_penalties(lengths, RewardConfig(), 10) == [0.0] * 6
    shaped = overlong_penalties(lengths, RewardConfig(overlong_buffer=4), 10)
    assert shaped == pytest.approx([0.0, 0.0, -0.25, -0.5, -0.75, -1.0])
    half = RewardConfig(overlong_buffer=4, overlong_penalty_factor=0.5)
    assert overlong_penalties(lengths, half, 10) == pytest.approx(
        [0, 0, -0.125, -0.25, -0.375, -0.5]
    )


def test_the_paper_settings_compose():
    config, _ = compose(
        ["reward.verifier=dapo", "rollout.max_new_tokens=64", "reward.overlong_buffer=16"]
    )
    assert config.reward.verifier == "dapo" and config.reward.incorrect_score is None
    assert config.reward.overlong_buffer == 16
    config, _ = compose(["reward.verifier=answer", "reward.incorrect_score=-0.5"])
    assert config.reward.incorrect_score == -0.5


@pytest.mark.parametrize(
    ("overrides", "key"),
    [
        (["reward.verifier=exact"], "reward.verifier"),
        (["reward.incorrect_score=1.0"], "reward.incorrect_score"),
        (["reward.overlong_buffer=-1"], "reward.overlong_buffer"),
        (["rollout.max_new_tokens=32", "reward.overlong_buffer=32"], "reward.overlong_buffer"),
        (["reward.overlong_penalty_factor=0.5"], "reward.overlong_penalty_factor"),
        (
            ["reward.overlong_buffer=4", "reward.overlong_penalty_factor=-1"],
            "reward.overlong_penalty_factor",
        ),
        (["+reward.wrong_score=0"], "reward.wrong_score"),
        (["reward.workers=-1"], "reward.workers"),
        # The keys ScoringConfig checks, reported under the key for every kind of scoring.
        (["reward.timeout_s=0"], "reward.timeout_s"),
        (["reward.verifier=math_verify", "reward.timeout_s=-1"], "reward.timeout_s"),
        (["reward.function=pkg.mod:fn", "reward.timeout_s=0"], "reward.timeout_s"),
        (["reward.verifier=dapo", "reward.incorrect_score=2.0"], "reward.incorrect_score"),
        (["reward.function=pkg.mod:fn", "reward.incorrect_score=1"], "reward.incorrect_score"),
        (["reward.function=module.only"], "reward.function"),
    ],
)
def test_bad_reward_settings_name_the_key(overrides, key):
    with pytest.raises(ValueError, match=key.replace(".", r"\.")):
        compose(overrides)
