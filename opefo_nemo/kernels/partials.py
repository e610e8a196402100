"""A shard's softmax partial sums relative to its own row max, and their shift to the global max.

The Triton kernels read a vocabulary shard once and keep, per token row, the running max ``m_r``
of the raw logits ``z`` and, with ``d = (z − m_r)/T`` and ``e = exp(d)``, the sums
``[S0, S1, S2, S3] = [Σ e, Σ e·d, Σ e², Σ e²·d]`` (online: whenever a tile raises the max from
``m`` to ``m'``, the sums so far are rescaled by :func:`shift` with ``δ = (m − m')/T``).

After the all-reduce MAX gives the global max ``m ≥ m_r``, the same :func:`shift` with
``δ = (m_r − m)/T ≤ 0`` turns them into sums relative to ``m``, ready for the all-reduce SUM. With
``α = exp(δ)`` each term changes as ``e ↦ α e``, ``d ↦ d + δ``, so

    S0 ↦ α S0,   S1 ↦ α (S1 + δ S0),   S2 ↦ α² S2,   S3 ↦ α² (S3 + δ S2).

Every term of ``S1 + δ S0`` (and of ``S3 + δ S2``) is ≤ 0: no cancellation. A row with no finite
logit in this shard (``m_r = −inf``) has all sums 0 and stays 0.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor


@dataclass(frozen=True)
class ShardPartials:
    """What one read of a shard gives per token, all ``[tokens]`` fp32 unless said otherwise.

    ``local_max``: max of this shard's real columns (raw logits, ``−inf`` when it has none).
    ``sums``: ``[tokens, 4]`` ``[S0, S1, S2, S3]`` relative to ``local_max`` (``S2``, ``S3`` are
    0 unless the tabular sums were asked for). ``target_logit``: the raw logit of the target where
    this shard owns it, else 0. ``bad`` (bool): a real column holds NaN or ``+inf``.
    """

    local_max: Tensor
    sums: Tensor
    target_logit: Tensor
    bad: Tensor


def shift(sums: Tensor, delta: Tensor) -> Tensor:
    """The sums ``[tokens, 4]`` after every ``d`` moves by ``delta`` ``[tokens]`` (≤ 0, or
    ``−inf``: the sums were empty), as a new tensor; see the module docstring."""
    alpha = torch.exp(delta)
    delta = torch.where(torch.isneginf(delta), 0.0, delta)
    s0, s1, s2, s3 = sums.unbind(1)
    alpha2 = alpha * alpha
    return torch.stack(
        [alpha * s0, alpha * (s1 + delta * s0), alpha2 * s2, alpha2 * (s3 + delta * s2)], dim=1
    )


def to_global_max(partials: ShardPartials, row_max: Tensor, inv_t: float) -> Tensor:
    """``[S0, S1, S2, S3]`` ``[tokens, 4]`` of this shard relative to the global ``row_max``
    (``≥ local_max``); ``−inf`` local maxima give 0 (``δ = −inf``, ``α = 0``)."""
    empty = torch.isneginf(partials.local_max)
    delta = torch.where(empty, float("-inf"), (partials.local_max - row_max) * inv_t)
    return shift(partials.sums, delta)
