"""The clipped surrogate of the approximate on-policy methods (spec §5) and its clip metrics: the
base of ``grpo``, ``clip_higher``, ``clip_cov``, ``entropy_reg`` and ``steer``."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from opefo_nemo.core.objectives.base import MethodConfig, Objective, positive
from opefo_nemo.core.objectives.tokens import LossInputs
from opefo_nemo.core.schema import require


@dataclass(frozen=True)
class ClippedConfig(MethodConfig):
    """Settings of the clipped surrogate ``ℓ_t = max(−A ρ, −A clip(ρ, 1 − ε_low, 1 + ε_high))``;
    with dual clip (``clip_ratio_c = c``, ``null`` disables) the loss of ``A < 0`` is capped at
    ``−c A``, so a token whose ratio has grown far beyond the clip range cannot dominate the
    batch. The paper's approximate on-policy schedule: 8 sequential mini-batch updates per
    rollout at lr 1e-6."""

    updates_per_rollout: int = 8
    lr: float = 1e-6
    clip_eps_low: float = 0.2
    """Ratio clip: the lower bound 1 − ε_low, ε_low in (0, 1)."""
    clip_eps_high: float = 0.2
    """Ratio clip: the upper bound 1 + ε_high, ε_high > 0."""
    clip_ratio_c: float | None = 3.0
    """Dual clip: for A < 0 the loss is capped at −c·A (c > 1; null: off)."""

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        positive(self.clip_eps_low, f"{prefix}.clip_eps_low")
        positive(self.clip_eps_high, f"{prefix}.clip_eps_high")
        require(self.clip_eps_low < 1, f"{prefix}.clip_eps_low", "must be < 1")
        c = self.clip_ratio_c
        require(
            c is None or (math.isfinite(c) and c > 1),
            f"{prefix}.clip_ratio_c",
            f"must be > 1 (or null: no dual clip), got {c}",
        )


def surrogate_terms(inputs: LossInputs, config: ClippedConfig) -> tuple[Tensor, Tensor]:
    """``(clipped, ℓ)``: the PPO surrogate ``max(−A ρ, −A clip(ρ))`` and the same with the dual
    clip's cap ``min(·, −c A)`` on ``A < 0`` (equal when ``clip_ratio_c`` is null)."""
    ratio, adv = inputs.ratio, inputs.advantages
    bounded = torch.clamp(ratio, 1.0 - config.clip_eps_low, 1.0 + config.clip_eps_high)
    clipped = torch.maximum(-adv * ratio, -adv * bounded)
    if config.clip_ratio_c is None:
        return clipped, clipped
    capped = torch.minimum(clipped, -adv * config.clip_ratio_c)
    return clipped, torch.where(adv < 0, capped, clipped)


class ClippedSurrogate(Objective):
    """The clipped surrogate with its clip metrics (module docstring); registered by its methods."""

    config_type = ClippedConfig
    strict = False
    loss_sum_names: ClassVar[tuple[str, ...]] = (
        "clip_upper",
        "clip_lower",
        "dh_upper",
        "dh_lower",
        "clip_dual",
    )

    @property
    def clipping(self) -> ClippedConfig:
        assert isinstance(self.config, ClippedConfig)
        return self.config

    def token_loss(self, inputs: LossInputs) -> Tensor:
        return surrogate_terms(inputs, self.clipping)[1]

    def loss_sums(self, inputs: LossInputs, valid: Tensor, delta_h: Tensor) -> dict[str, Tensor]:
        config = self.clipping
        ratio, adv = inputs.ratio.detach(), inputs.advantages
        upper = valid & (adv > 0) & (ratio > 1 + config.clip_eps_high)
        lower = valid & (adv < 0) & (ratio < 1 - config.clip_eps_low)
        dual = torch.zeros_like(valid)
        if config.clip_ratio_c is not None:
            clipped = surrogate_terms(inputs, config)[0].detach()
            dual = valid & (adv < 0) & (clipped > -adv * config.clip_ratio_c)
        dh = delta_h.double()
        return {
            "clip_upper": upper.sum().double(),
            "clip_lower": lower.sum().double(),
            "dh_upper": (dh * upper).sum(),
            "dh_lower": (dh * lower).sum(),
            "clip_dual": dual.sum().double(),
        }

    def loss_metrics(self, sums: Mapping[str, float], n_tokens: int) -> dict[str, float]:
        """spec §6, the paper's Fig. 2c: ``clip/frac_upper`` (A > 0, ρ > 1 + ε_high),
        ``clip/frac_lower`` (A < 0, ρ < 1 − ε_low), the summed ΔH of those tokens
        ``clip/dh_upper`` / ``clip/dh_lower``, and ``clip/frac_dual`` (A < 0, the dual clip's cap
        active), each fraction of the batch's tokens."""
        return {
            "clip/frac_upper": float(sums["clip_upper"]) / n_tokens,
            "clip/frac_lower": float(sums["clip_lower"]) / n_tokens,
            "clip/dh_upper": float(sums["dh_upper"]),
            "clip/dh_lower": float(sums["dh_lower"]),
            "clip/frac_dual": float(sums["clip_dual"]) / n_tokens,
        }
