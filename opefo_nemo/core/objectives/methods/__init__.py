"""The built-in methods of spec §5, one module each (importing this package registers them)."""

from opefo_nemo.core.objectives.methods import (
    clip_cov,
    clipped,
    entropy_neutral,
    entropy_reg,
    kl_cov,
    policy_gradient,
    steer,
)

__all__ = [
    "clip_cov",
    "clipped",
    "entropy_neutral",
    "entropy_reg",
    "kl_cov",
    "policy_gradient",
    "steer",
]
