"""Clip-Cov and KL-Cov token selections, chosen over the whole optimizer-step batch (spec §5).

``cov_t = (A_t − Ā)(logprob_t − mean logprob)`` with both means over every valid token of the
batch (all micro-batches, all ranks). Each selection is a top-k under the reducer's total order:

* ``kl_cov``: the ``k = max(⌊r_k · N⌋, 1)`` tokens of largest ``cov_t``;
* ``clip_cov``: among tokens with ``lb < cov_t < ub`` that the ratio clip has not already clipped,
  a uniformly random subset of ``k = max(⌊r_c · N⌋, 1)``. The randomness is a hash of
  ``(seed, token id)``, so the same seed picks the same tokens whatever the layout.
"""

from __future__ import annotations

import torch
from torch import Tensor

from .config import MethodConfig
from .tokens import TokenChunk

_PRIME = 2_147_483_647  # 2**31 − 1: products of two residues stay inside int64
_MULTIPLIERS = (48_271, 69_621, 16_807, 39_373)


def covariance(chunk: TokenChunk, adv_mean: float, logprob_mean: float) -> Tensor:
    """``cov_t`` of spec §5 for every token of ``chunk`` (float64, shape ``[*]``)."""
    return (chunk.advantages.double() - adv_mean) * (chunk.logprob.double() - logprob_mean)


def token_uniform(token_ids: Tensor, seed: int) -> Tensor:
    """A deterministic pseudo-uniform number in [0, 1) per token id (float64, shape ``[*]``).

    Integer hashing with a Lehmer-style mix modulo 2³¹ − 1; depends only on ``(seed, id)``.
    """
    ids = token_ids.to(torch.int64)
    low = torch.remainder(ids, _PRIME)
    high = torch.remainder(torch.div(ids, _PRIME, rounding_mode="floor"), _PRIME)
    x = torch.remainder(low + (int(seed) % _PRIME) * 7 + 1, _PRIME)
    for step, multiplier in enumerate(_MULTIPLIERS):
        x = torch.remainder(x * multiplier + high + step, _PRIME)
        x = torch.bitwise_xor(x, torch.bitwise_right_shift(x, 11))
    return x.double() / _PRIME


def ratio_clipped(chunk: TokenChunk, config: MethodConfig) -> Tensor:
    """Tokens the ratio clip already removes: ``A > 0, ρ > 1 + ε_high`` or ``A < 0, ρ < 1 − ε_low``.

    In strict mode (no ``old_logprob``) ρ ≡ 1 and nothing is clipped.
    """
    if chunk.old_logprob is None:
        return torch.zeros_like(chunk.mask)
    ratio = torch.exp(chunk.logprob.double() - chunk.old_logprob.double())
    adv = chunk.advantages
    return ((adv > 0) & (ratio > 1 + config.clip_eps_high)) | (
        (adv < 0) & (ratio < 1 - config.clip_eps_low)
    )


def selection_scores(
    kind: str, chunk: TokenChunk, cov: Tensor, config: MethodConfig, seed: int
) -> Tensor:
    """Per-token scores for the top-k (float64 ``[*]``); ``-inf`` marks a non-candidate."""
    minus_inf = torch.full_like(cov, float("-inf"))
    if kind == "kl_cov":
        return torch.where(chunk.mask, cov, minus_inf)
    if chunk.token_ids is None:
        raise ValueError("clip_cov needs TokenChunk.token_ids (unique global token ids)")
    bounds = config.clip_cov
    candidate = chunk.mask & (cov > bounds.lb) & (cov < bounds.ub) & ~ratio_clipped(chunk, config)
    return torch.where(candidate, token_uniform(chunk.token_ids, seed), minus_inf)


def selection_count(kind: str, n_tokens: int, config: MethodConfig) -> int:
    """``k = max(⌊ratio · N⌋, 1)`` with the method's ratio and the global token count ``N``."""
    ratio = config.kl_cov.ratio if kind == "kl_cov" else config.clip_cov.ratio
    return max(int(ratio * n_tokens), 1)
