"""Clip-Cov (Cui et al. 2025; spec §5): the clipped surrogate with the gradient removed on a random
``r_c`` of the batch's tokens whose covariance lies in ``(lb, ub)``; ``select/frac`` logs the
chosen fraction.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import torch
from torch import Tensor

from opefo_nemo.core.objectives.base import BatchStatistics, fraction
from opefo_nemo.core.objectives.methods.clipped_surrogate import ClippedConfig, ClippedSurrogate
from opefo_nemo.core.objectives.methods.covariance import (
    covariance,
    covariance_means,
    covariance_sums,
    select_top_k,
    selection_coefficients,
    selection_count,
    token_uniform,
)
from opefo_nemo.core.objectives.registry import register_objective
from opefo_nemo.core.objectives.tokens import Coefficients, LossInputs, TokenChunk
from opefo_nemo.core.reduction import BatchReducer
from opefo_nemo.core.schema import require


@dataclass(frozen=True)
class ClipCovSettings:
    """``method.clip_cov``: which tokens lose their gradient."""

    ratio: float = 2e-4
    """r_c: the fraction of the batch's tokens whose gradient is removed, in (0, 1]."""
    lb: float = 1.0
    """Candidates have lb < cov_t < ub, cov_t = (A − Ā)(logprob − mean logprob), both means over
    the whole optimizer-step batch."""
    ub: float = 5.0
    """The upper bound of the candidate window, > lb."""


@dataclass(frozen=True)
class ClipCovConfig(ClippedConfig):
    clip_ratio_c: float | None = None
    """Off, as in Cui et al.'s Clip-Cov."""
    clip_cov: ClipCovSettings = field(default_factory=ClipCovSettings)
    """Clip-Cov's token selection."""

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        fraction(self.clip_cov.ratio, f"{prefix}.clip_cov.ratio")
        require(self.clip_cov.lb < self.clip_cov.ub, f"{prefix}.clip_cov.lb", "must be < ub")


def ratio_clipped(chunk: TokenChunk, config: ClippedConfig) -> Tensor:
    """Tokens the ratio clip already removes (``A > 0, ρ > 1 + ε_high`` or
    ``A < 0, ρ < 1 − ε_low``); none when ``old_logprob`` is ``None`` (strict: ρ ≡ 1)."""
    if chunk.old_logprob is None:
        return torch.zeros_like(chunk.mask)
    ratio = torch.exp(chunk.logprob.double() - chunk.old_logprob.double())
    adv = chunk.advantages
    return ((adv > 0) & (ratio > 1 + config.clip_eps_high)) | (
        (adv < 0) & (ratio < 1 - config.clip_eps_low)
    )


@register_objective("clip_cov")
class ClipCov(ClippedSurrogate):
    """Clip-Cov (Cui et al. 2025 settings): the clipped surrogate, with the gradient removed on a
    random r_c of the tokens with lb < cov_t < ub, chosen over the whole optimizer-step batch (not
    per micro-batch); ``select/frac`` logs the chosen fraction."""

    config_type = ClipCovConfig
    loss_sum_names = (*ClippedSurrogate.loss_sum_names, "selected")

    @property
    def settings(self) -> ClipCovConfig:
        assert isinstance(self.config, ClipCovConfig)
        return self.config

    def local_sums(self, chunk: TokenChunk, delta_h: Tensor) -> dict[str, Tensor]:
        return covariance_sums(chunk)

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        window = self.settings.clip_cov
        adv_mean, logprob_mean = covariance_means(batch)
        scores = []
        for chunk in batch.chunks:
            if chunk.token_ids is None:
                raise ValueError("clip_cov needs TokenChunk.token_ids (unique global token ids)")
            cov = covariance(chunk, adv_mean, logprob_mean)
            candidate = (
                chunk.mask
                & (cov > window.lb)
                & (cov < window.ub)
                & ~ratio_clipped(chunk, self.settings)
            )
            minus_inf = torch.full_like(cov, float("-inf"))
            scores.append(torch.where(candidate, token_uniform(chunk.token_ids, seed), minus_inf))
        # k = max(⌊r_c · N⌋, 1) of the candidates, uniformly at random over the whole batch
        # (token_uniform: the same seed picks the same tokens whatever the layout).
        k = selection_count(window.ratio, batch.n_tokens)
        return selection_coefficients(batch, select_top_k(batch, scores, k, reducer))

    def token_loss(self, inputs: LossInputs) -> Tensor:
        surrogate = super().token_loss(inputs)
        return torch.where(inputs.selected, torch.zeros_like(surrogate), surrogate)

    def loss_sums(self, inputs: LossInputs, valid: Tensor, delta_h: Tensor) -> dict[str, Tensor]:
        sums = super().loss_sums(inputs, valid, delta_h)
        return {**sums, "selected": (inputs.selected & valid).sum().double()}

    def loss_metrics(self, sums: Mapping[str, float], n_tokens: int) -> dict[str, float]:
        metrics = super().loss_metrics(sums, n_tokens)
        return {**metrics, "select/frac": float(sums["selected"]) / n_tokens}
