"""KL-Cov (Cui et al. 2025; spec §5): ``ℓ_t = −A ρ`` plus ``κ |logprob − logprob_old|`` on the
``k = max(⌊r_k · N⌋, 1)`` tokens of largest covariance over the whole optimizer-step batch.
"""

from __future__ import annotations

import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from opefo_nemo.core.objectives.base import (
    BatchStatistics,
    MethodConfig,
    Objective,
    fraction,
    non_negative,
)
from opefo_nemo.core.objectives.methods.covariance import (
    covariance,
    covariance_means,
    covariance_sums,
    select_top_k,
    selection_coefficients,
    selection_count,
)
from opefo_nemo.core.objectives.registry import register_objective
from opefo_nemo.core.objectives.tokens import Coefficients, LossInputs, TokenChunk
from opefo_nemo.core.reduction import BatchReducer


@dataclass(frozen=True)
class KLCovSettings:
    """``method.kl_cov``: which tokens are penalised, and how much."""

    ratio: float = 2e-3
    """r_k: the fraction of the batch's tokens (the top by cov_t) that are penalised, in (0, 1]."""
    coef: float = 1.0
    """κ: the weight of |logprob − logprob_old| on the selected tokens, >= 0."""


@dataclass(frozen=True)
class KLCovConfig(MethodConfig):
    updates_per_rollout: int = 8
    """The penalty needs ρ ≠ 1: approximate on-policy, as in the paper."""
    lr: float = 1e-6
    kl_cov: KLCovSettings = field(default_factory=KLCovSettings)
    """KL-Cov's penalty."""

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        fraction(self.kl_cov.ratio, f"{prefix}.kl_cov.ratio")
        non_negative(self.kl_cov.coef, f"{prefix}.kl_cov.coef")
        if self.strict_on_policy:
            warnings.warn(
                f"{prefix}: KL-Cov's penalty |logprob - logprob_old| is identically zero with one "
                "update per rollout (strict on-policy, ratio = 1); only its top-k selection runs",
                stacklevel=2,
            )


@register_objective("kl_cov")
class KLCov(Objective):
    """KL-Cov (Cui et al. 2025 settings): ``−A ρ`` plus ``κ |logprob − logprob_old|`` on the
    top r_k of the tokens by cov_t over the whole optimizer-step batch. No ratio clip, so no
    ``clip/*`` metrics; ``select/frac`` logs the penalised fraction. With one update per rollout
    (ρ ≡ 1) the penalty is identically zero and only the selection runs (a warning says so at
    start-up)."""

    config_type = KLCovConfig
    strict = False
    loss_sum_names = ("selected",)

    @property
    def settings(self) -> KLCovConfig:
        assert isinstance(self.config, KLCovConfig)
        return self.config

    def local_sums(self, chunk: TokenChunk, delta_h: Tensor) -> dict[str, Tensor]:
        return covariance_sums(chunk)

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        adv_mean, logprob_mean = covariance_means(batch)
        minus_inf = float("-inf")
        scores = [
            torch.where(c.mask, covariance(c, adv_mean, logprob_mean), minus_inf)
            for c in batch.chunks
        ]
        k = selection_count(self.settings.kl_cov.ratio, batch.n_tokens)
        return selection_coefficients(batch, select_top_k(batch, scores, k, reducer))

    def token_loss(self, inputs: LossInputs) -> Tensor:
        penalty = self.settings.kl_cov.coef * (inputs.logprob - inputs.old_logprob).abs()
        return -inputs.advantages * inputs.ratio + torch.where(
            inputs.selected, penalty, torch.zeros_like(penalty)
        )

    def loss_sums(self, inputs: LossInputs, valid: Tensor, delta_h: Tensor) -> dict[str, Tensor]:
        return {"selected": (inputs.selected & valid).sum().double()}

    def loss_metrics(self, sums: Mapping[str, float], n_tokens: int) -> dict[str, float]:
        return {"select/frac": float(sums["selected"]) / n_tokens}
