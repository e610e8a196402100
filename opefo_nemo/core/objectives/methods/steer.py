"""STEER (spec §5): the clipped surrogate with dual clip, each token's loss weighted by the size of
its first-order entropy change (method of "Rethinking Entropy Interventions in RLVR: An Entropy
Change Perspective"). Its conventions and scopes: docs/core.md, "STEER".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from torch import Tensor

from opefo_nemo.core.objectives.base import BatchStatistics
from opefo_nemo.core.objectives.methods.clipped_surrogate import (
    ClippedConfig,
    ClippedSurrogate,
    surrogate_terms,
)
from opefo_nemo.core.objectives.registry import register_objective
from opefo_nemo.core.objectives.tokens import Coefficients, LossInputs, TokenChunk
from opefo_nemo.core.reduction import BatchReducer, local_top_k
from opefo_nemo.core.schema import one_of, require

SCOPES = ("micro_batch", "batch")
MAPPINGS = ("linear", "exponential")
_PROB_FLOOR = 1e-8  # the clamps of π and π_old (entropy_change_magnitude)
_EXPONENTIAL_SCALE_FLOOR = 0.02  # k's denominator never falls below it


@dataclass(frozen=True)
class SteerSettings:
    """``method.steer``: how |Ω| is mapped to the weights."""

    scope: str = "batch"
    """The tokens whose least and largest |Ω| set the mapping: ``batch`` (the whole
    optimizer-step batch, like every global sum) | ``micro_batch`` (each chunk of
    ``engine.micro_batch_size`` responses on its own, as STEER's code does; needs
    ``engine.batch_layout=contiguous``)."""
    mapping: str = "linear"
    """``linear``: |Ω| mapped onto [weight_min, weight_max], the largest |Ω| → weight_min |
    ``exponential``: exp(−k|Ω|) within [weight_min, 1], k = −ln(weight_min) / max(largest |Ω|,
    0.02) (needs weight_max: 1.0)."""
    weight_min: float = 0.8
    """The least weight, in (0, weight_max] (exponential: < 1)."""
    weight_max: float = 1.2
    """The largest weight (exponential: exactly 1.0)."""


@dataclass(frozen=True)
class SteerConfig(ClippedConfig):
    clip_eps_high: float = 0.28
    """STEER's published runs: 0.28."""
    clip_ratio_c: float | None = 10.0
    """STEER's published runs: 10."""
    steer: SteerSettings = field(default_factory=SteerSettings)
    """STEER's token weights (docs/core.md, "STEER")."""

    @property
    def layout_invariant(self) -> bool:
        """The ``micro_batch`` scope maps each micro-batch's |Ω| range on its own."""
        return self.steer.scope != "micro_batch"

    def validate(self, prefix: str) -> None:
        super().validate(prefix)
        s, path = self.steer, f"{prefix}.steer"
        one_of(s.scope, SCOPES, f"{path}.scope")
        one_of(s.mapping, MAPPINGS, f"{path}.mapping")
        require(
            math.isfinite(s.weight_min) and 0 < s.weight_min <= s.weight_max,
            f"{path}.weight_min",
            f"must lie in (0, weight_max = {s.weight_max}], got {s.weight_min}",
        )
        require(math.isfinite(s.weight_max), f"{path}.weight_max", "must be finite")
        if s.mapping == "exponential":
            require(
                s.weight_min < 1 and s.weight_max == 1,
                f"{path}.weight_max",
                f"is {s.weight_max} with weight_min {s.weight_min}, but exponential weights lie "
                "in [weight_min, 1]: set weight_min < 1 and weight_max: 1.0",
            )


def entropy_change_magnitude(chunk: TokenChunk) -> Tensor:
    """``|Ω_t|`` of every token of ``chunk`` (float64, shape ``[*]``):
    ``Ω_t = A_t / π_old(y_t) · π(y_t)(1 − π(y_t))(log π(y_t) + H_t)``, with ``π`` the current
    policy's probability of the sampled token (clamped to ``[1e-8, 1 − 1e-8]``), ``π_old`` the
    rollout policy's (clamped to ``[1e-8, 1]``; the current one when strict) and ``H_t`` the
    rollout policy's entropy at the token (``TokenChunk.old_entropy``, else the current one); a
    non-finite ``Ω_t`` counts as 0."""
    p = chunk.logprob.double().exp().clamp(_PROB_FLOOR, 1 - _PROB_FLOOR)
    old_logprob = chunk.logprob if chunk.old_logprob is None else chunk.old_logprob
    p_old = old_logprob.double().exp().clamp(_PROB_FLOOR, 1.0)
    entropy = chunk.entropy if chunk.old_entropy is None else chunk.old_entropy
    omega = chunk.advantages.double() / p_old * p * (1 - p) * (p.log() + entropy.double())
    return torch.where(torch.isfinite(omega), omega, torch.zeros_like(omega)).abs()


def map_weights(magnitude: Tensor, low: float, high: float, settings: SteerSettings) -> Tensor:
    """The weight of each ``|Ω_t|`` given the scope's least and largest ``low`` = ``m``,
    ``high`` = ``M``, so the tokens that move the entropy most get the smallest weight:

    * ``linear``: ``w_t = w_max − (|Ω_t| − m)(w_max − w_min)/(M − m)`` (the midpoint when
      ``M = m``);
    * ``exponential``: ``w_t = clip(exp(−k |Ω_t|), w_min, 1)``, ``k = −ln(w_min) / max(M, 0.02)``.
    """
    w_min, w_max = settings.weight_min, settings.weight_max
    if settings.mapping == "exponential":
        k = -math.log(w_min) / max(high, _EXPONENTIAL_SCALE_FLOOR)
        return torch.exp(-k * magnitude).clamp(w_min, 1.0)
    if high > low:
        weight = w_max - (magnitude - low) * ((w_max - w_min) / (high - low))
        return weight.clamp(w_min, w_max)
    return torch.full_like(magnitude, (w_min + w_max) / 2)


def _valid_range(magnitude: Tensor, mask: Tensor) -> tuple[float, float] | None:
    """``(m, M)`` of ``magnitude`` over ``mask``; ``None`` when no token is valid."""
    valid = magnitude[mask]
    if valid.numel() == 0:
        return None
    return float(valid.min()), float(valid.max())


def _global_range(
    chunks: Sequence[TokenChunk], magnitudes: Sequence[Tensor], reducer: BatchReducer
) -> tuple[float, float]:
    """``(m, M)`` over every valid token of the batch: two ``reducer.top_k`` of one candidate."""
    scores, keys = [], []
    for chunk, magnitude in zip(chunks, magnitudes, strict=True):
        if chunk.token_ids is None:
            raise ValueError("steer needs TokenChunk.token_ids (unique global token ids)")
        scores.append(magnitude[chunk.mask])
        keys.append(chunk.token_ids.to(torch.int64)[chunk.mask])
    flat_scores, flat_keys = torch.cat(scores), torch.cat(keys)
    largest = reducer.top_k(*local_top_k(flat_scores, flat_keys, 1), 1)
    smallest = reducer.top_k(*local_top_k(-flat_scores, flat_keys, 1), 1)
    assert largest is not None and smallest is not None  # prepare refuses a batch of no tokens
    return -smallest.score, largest.score


@register_objective("steer")
class Steer(ClippedSurrogate):
    """STEER ("Rethinking Entropy Interventions in RLVR: An Entropy Change Perspective"), with the
    settings of its published linear runs: ``ℓ_t = w_t · clipped surrogate`` with dual clip, each
    token's weight from |Ω_t|, its first-order entropy change ``Ω_t = A_t/π_old · π(1 − π)(log
    π + H_t)``: the tokens that move the entropy most get the smallest weight
    (:func:`map_weights` over the |Ω| range of ``steer.scope``: one micro-batch, i.e. one chunk
    of ``prepare``, or the whole optimizer-step batch through the reducer). Metrics:
    ``steer/weight_mean`` (over the batch's valid tokens), ``steer/omega_min`` and
    ``steer/omega_max`` (``m`` and ``M`` over the whole batch, whatever the scope)."""

    config_type = SteerConfig

    def __init__(self, config: SteerConfig):
        super().__init__(config)
        self.last_metrics: dict[str, float] = {}

    @property
    def settings(self) -> SteerSettings:
        assert isinstance(self.config, SteerConfig)
        return self.config.steer

    def coefficients(
        self, batch: BatchStatistics, reducer: BatchReducer, seed: int
    ) -> list[Coefficients]:
        settings = self.settings
        magnitudes = [entropy_change_magnitude(c) for c in batch.chunks]
        low, high = _global_range(batch.chunks, magnitudes, reducer)
        out, weight_sum = [], torch.zeros((), dtype=torch.float64)
        for chunk, magnitude, dh in zip(batch.chunks, magnitudes, batch.delta_h, strict=True):
            scope = (
                (low, high) if settings.scope == "batch" else _valid_range(magnitude, chunk.mask)
            )
            weight = torch.ones_like(magnitude)
            if scope is not None:
                weight = torch.where(chunk.mask, map_weights(magnitude, *scope, settings), weight)
            weight = weight.to(dh.dtype)
            weight_sum = weight_sum + (weight.double() * chunk.mask).sum()
            out.append(
                Coefficients(delta_h=dh, weight=weight, selected=torch.zeros_like(chunk.mask))
            )
        total = reducer.sum({"steer_weight": weight_sum})["steer_weight"]
        self.last_metrics = {
            "steer/weight_mean": float(total) / batch.n_tokens,
            "steer/omega_min": low,
            "steer/omega_max": high,
        }
        return out

    def metrics(self, batch: BatchStatistics) -> dict[str, float]:
        return dict(self.last_metrics)

    def token_loss(self, inputs: LossInputs) -> Tensor:
        return inputs.weight * surrogate_terms(inputs, self.clipping)[1]
