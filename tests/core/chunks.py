"""Settings of every method and random token chunks, shared by the tests of the objectives."""

from __future__ import annotations

import torch

from opefo_nemo.core.objectives import Objective, TokenChunk, build_objective, method_config

METHOD_SETTINGS = {
    "grpo": {"updates_per_rollout": 8},
    "clip_higher": {"updates_per_rollout": 8, "clip_eps_high": 0.28, "clip_ratio_c": 1.5},
    "entropy_reg": {"updates_per_rollout": 8, "entropy_coef": 0.01},
    "clip_cov": {"updates_per_rollout": 8, "clip_cov": {"ratio": 0.05, "lb": -0.5, "ub": 0.5}},
    "kl_cov": {"updates_per_rollout": 8, "kl_cov": {"ratio": 0.1, "coef": 1.0}},
    "grpo_strict": {},
    "opefo": {"entropy_flow": {"balance": "adaptive"}},
    "static": {"entropy_flow": {"balance": "static", "static_lambda": 0.2}},
    "pos_only": {"entropy_flow": {"balance": "pos_only"}},
    "neg_only": {"entropy_flow": {"balance": "neg_only"}},
    "entropy_neutral": {"entropy_flow": {"balance": "target", "target_entropy": 0.5}},
    "steer": {"updates_per_rollout": 8},
    "correct_only": {},
    "incorrect_only": {},
}


def method(name: str) -> Objective:
    return build_objective(method_config({"name": name, **METHOD_SETTINGS[name]}))


def batch(n: int = 96, seed: int = 0, multi_update: bool = False) -> TokenChunk:
    g = torch.Generator().manual_seed(seed)
    lp = -torch.rand(n, generator=g) * 4
    old = lp + torch.randn(n, generator=g) * 0.3 if multi_update else None
    return TokenChunk(
        logprob=lp,
        entropy=torch.rand(n, generator=g) * 3,
        advantages=torch.randn(n, generator=g),
        mask=torch.rand(n, generator=g) > 0.25,
        old_logprob=old,
        token_ids=torch.randperm(10 * n, generator=g)[:n],
    )
