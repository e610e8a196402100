"""The built-in methods of spec §5, one module each (importing this package registers them); the
bases they share: :mod:`.clipped_surrogate`, :mod:`.balanced_policy_gradient`,
:mod:`.covariance`, :mod:`.advantage_sign`."""

from opefo_nemo.core.objectives.methods import (
    clip_cov,
    clip_higher,
    correct_only,
    entropy_neutral,
    entropy_reg,
    grpo,
    grpo_strict,
    incorrect_only,
    kl_cov,
    neg_only,
    opefo,
    pos_only,
    static,
    steer,
)

__all__ = [
    "clip_cov",
    "clip_higher",
    "correct_only",
    "entropy_neutral",
    "entropy_reg",
    "grpo",
    "grpo_strict",
    "incorrect_only",
    "kl_cov",
    "neg_only",
    "opefo",
    "pos_only",
    "static",
    "steer",
]
