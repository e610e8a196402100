"""The rollout service's request and reply types (``rollout/types.py``): sampling settings are
validated and travel as JSON, a completion checks its lengths."""

from __future__ import annotations

import pytest

from opefo_nemo.rollout.types import Completion, SamplingConfig


def test_sampling_config_validation_and_json():
    config = SamplingConfig(temperature=0.5, top_p=0.9, top_k=3, stop_token_ids=[2], seed=4)
    assert config.stop_token_ids == (2,)
    assert SamplingConfig.from_json(config.to_json()) == config
    for bad in (
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"top_p": 1.5},
        {"top_k": -1},
        {"max_new_tokens": 0},
        {"stop_token_ids": (-3,)},
        {"seed": 1.5},
    ):
        with pytest.raises(ValueError, match=next(iter(bad))):
            SamplingConfig(**bad)


def test_completion_checks_lengths():
    with pytest.raises(ValueError, match="2 token ids but 1 logprobs"):
        Completion(0, 0, [1, 2], [-0.1], "stop")
