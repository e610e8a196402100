"""A shard's softmax partial sums relative to its own row max, their shift to the global max, and
which of them a request for vocabulary sums needs (the math: docs/kernels.md, "The math, per token
row").
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
from torch import Tensor

#: The vocabulary sums ``token_stats`` adds on request, by the power ``k`` of ``π`` they need:
#: ``Σ π^k`` and ``Σ π^k log π`` come from the shard sums ``Σ e^k`` and ``Σ e^k·d``.
POWER_SUMS: dict[int, tuple[str, str]] = {
    2: ("sum_p2", "sum_p2_logp"),
    3: ("sum_p3", "sum_p3_logp"),
}
#: Every requestable vocabulary sum, in ``TokenStats`` field order.
VOCAB_SUMS = tuple(name for pair in POWER_SUMS.values() for name in pair)
#: Columns of :attr:`ShardPartials.sums`: ``Σ e^k``, ``Σ e^k·d`` for ``k = 1, 2, 3``.
SUM_COLUMNS = 6


def requested_sums(sums: Sequence[str]) -> tuple[str, ...]:
    """``sums`` deduplicated in :data:`VOCAB_SUMS` order; an unknown name raises naming it."""
    if isinstance(sums, str):
        raise TypeError(f"sums is a sequence of names, got the string {sums!r}")
    unknown = [name for name in sums if name not in VOCAB_SUMS]
    if unknown:
        raise ValueError(f"unknown vocabulary sum {unknown[0]!r}; expected names from {VOCAB_SUMS}")
    return tuple(name for name in VOCAB_SUMS if name in sums)


def powers_of(sums: Sequence[str]) -> tuple[int, ...]:
    """The powers ``k`` (ascending, a subset of ``(2, 3)``) whose shard sums ``sums`` need."""
    return tuple(k for k, pair in POWER_SUMS.items() if any(name in sums for name in pair))


@dataclass(frozen=True)
class ShardPartials:
    """What one read of a shard gives per token, all ``[tokens]`` fp32 unless said otherwise.
    With ``d = (z − local_max)/T`` and ``e = exp(d)``, ``[S0, …, S5] = [Σ e, Σ e·d, Σ e², Σ e²·d,
    Σ e³, Σ e³·d]``: ``S0``, ``S1`` always (``logprob``, ``H``), the pairs of power 2 and 3 only
    when a vocabulary sum needs them (:data:`POWER_SUMS`).

    ``local_max``: max of this shard's real columns (raw logits, ``−inf`` when it has none).
    ``sums``: ``[tokens, 6]`` ``[S0, …, S5]`` relative to ``local_max`` (the pairs of powers 2 and
    3 are 0 unless asked for). ``target_logit``: the raw logit of the target where this shard owns
    it, else 0. ``bad`` (bool): a real column holds NaN or ``+inf``.
    """

    local_max: Tensor
    sums: Tensor
    target_logit: Tensor
    bad: Tensor


def shift(sums: Tensor, delta: Tensor) -> Tensor:
    """The sums ``[tokens, 6]`` after every ``d`` moves by ``delta`` ``[tokens]`` (≤ 0, or
    ``−inf``: the sums were empty), as a new tensor. With ``α = exp(δ)`` each term changes as
    ``e ↦ α e``, ``d ↦ d + δ``, so for each power ``k``: ``Σ e^k ↦ α^k Σ e^k`` and
    ``Σ e^k·d ↦ α^k (Σ e^k·d + δ Σ e^k)``; every term of the latter is ≤ 0, so no cancellation.
    The kernels apply it online when a tile raises the running max (``δ = (m − m')/T``) and
    :func:`to_global_max` after the all-reduce MAX."""
    alpha = torch.exp(delta)
    delta = torch.where(torch.isneginf(delta), 0.0, delta)
    columns, alpha_k = [], alpha
    for k in range(SUM_COLUMNS // 2):
        s_k, s_kd = sums[:, 2 * k], sums[:, 2 * k + 1]
        columns += [alpha_k * s_k, alpha_k * (s_kd + delta * s_k)]
        alpha_k = alpha_k * alpha
    return torch.stack(columns, dim=1)


def to_global_max(partials: ShardPartials, row_max: Tensor, inv_t: float) -> Tensor:
    """``[S0, …, S5]`` ``[tokens, 6]`` of this shard relative to the global ``row_max``
    (``≥ local_max``); ``−inf`` local maxima give 0 (``δ = −inf``, ``α = 0``)."""
    empty = torch.isneginf(partials.local_max)
    delta = torch.where(empty, float("-inf"), (partials.local_max - row_max) * inv_t)
    return shift(partials.sums, delta)
