"""The ``rollout`` section: a training step samples the full temperature-scaled softmax with the
section's length limit, and the keys the sampling itself checks (``SamplingConfig``) are refused
under their ``rollout.`` name."""

from __future__ import annotations

import re

import pytest

from opefo_nemo.config.compose import compose
from opefo_nemo.rollout.types import SamplingConfig


def test_a_training_step_samples_the_full_softmax_of_the_section():
    config, _ = compose(["rollout.temperature=0.7", "rollout.max_new_tokens=9"])
    sampling = config.rollout.sampling((2, 5), seed=11)
    assert sampling == SamplingConfig(
        temperature=0.7, top_p=1.0, top_k=0, max_new_tokens=9, stop_token_ids=(2, 5), seed=11
    )


@pytest.mark.parametrize(
    ("override", "key"),
    [
        ("rollout.max_new_tokens=0", "rollout.max_new_tokens"),
        ("rollout.temperature=inf", "rollout.temperature"),
        ("rollout.temperature=-1", "rollout.temperature"),
        ("rollout.stop_token_ids=[0,-2]", "rollout.stop_token_ids"),
    ],
)
def test_what_sampling_checks_is_refused_under_the_rollout_key(override, key):
    with pytest.raises(ValueError, match=re.escape(f"{key} ")) as refused:
        compose([override])
    assert "SamplingConfig" not in str(refused.value)
