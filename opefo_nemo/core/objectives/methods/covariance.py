"""What the Clip-Cov and KL-Cov selections share (spec §5): the covariance, and a top-k under the
reducer's total order with layout-independent randomness, so a selection is the same tokens
whatever the layout.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from opefo_nemo.core.objectives.base import BatchStatistics
from opefo_nemo.core.objectives.tokens import Coefficients, TokenChunk
from opefo_nemo.core.reduction import BatchReducer, local_top_k, select

_PRIME = 2_147_483_647  # 2**31 − 1: products of two residues stay inside int64
_MULTIPLIERS = (48_271, 69_621, 16_807, 39_373)


def covariance(chunk: TokenChunk, adv_mean: float, logprob_mean: float) -> Tensor:
    """``cov_t = (A_t − Ā)(logprob_t − mean logprob)`` of spec §5 for every token of ``chunk``
    (float64, shape ``[*]``), both means over every valid token of the batch (all
    micro-batches, all ranks: :func:`covariance_means`)."""
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


def covariance_means(batch: BatchStatistics) -> tuple[float, float]:
    """``(Ā, mean logprob)`` over the batch's valid tokens, from the global sums that
    :func:`covariance_sums` contributed."""
    return (
        float(batch.sums["cov_advantages"]) / batch.n_tokens,
        float(batch.sums["cov_logprob"]) / batch.n_tokens,
    )


def covariance_sums(chunk: TokenChunk) -> dict[str, Tensor]:
    """A chunk's share of ``Σ A_t`` and ``Σ logprob_t`` over valid tokens (0-d float64)."""
    mask = chunk.mask
    return {
        "cov_advantages": (chunk.advantages.double() * mask).sum(),
        "cov_logprob": (chunk.logprob.double() * mask).sum(),
    }


def select_top_k(
    batch: BatchStatistics, scores: Sequence[Tensor], k: int, reducer: BatchReducer
) -> list[Tensor]:
    """The ``k`` globally best tokens by ``scores`` (``-inf``: not a candidate), one
    ``reducer.top_k``, mapped back onto each chunk as boolean masks."""
    ids = []
    for chunk in batch.chunks:
        if chunk.token_ids is None:
            raise ValueError("a token selection needs TokenChunk.token_ids (unique global ids)")
        ids.append(chunk.token_ids.to(torch.int64))
    flat_scores = torch.cat([s.reshape(-1) for s in scores])
    flat_ids = torch.cat([i.reshape(-1) for i in ids])
    candidate = flat_scores > float("-inf")
    top_scores, top_ids = local_top_k(flat_scores[candidate], flat_ids[candidate], k)
    threshold = reducer.top_k(top_scores, top_ids, k)
    return [select(s, i, threshold) for s, i in zip(scores, ids, strict=True)]


def selection_count(ratio: float, n_tokens: int) -> int:
    """``k = max(⌊ratio · N⌋, 1)`` with the global token count ``N``."""
    return max(int(ratio * n_tokens), 1)


def selection_coefficients(
    batch: BatchStatistics, selected: Sequence[Tensor]
) -> list[Coefficients]:
    """Each chunk's coefficients of a selection method: its ΔH, weight 1, its selected tokens."""
    return [
        Coefficients(delta_h=dh, weight=torch.ones_like(dh), selected=s)
        for dh, s in zip(batch.delta_h, selected, strict=True)
    ]
