"""Chunk kernels of the vocab-parallel token statistics (spec §1), in plain torch, and the
collective steps every implementation shares (:func:`global_row_max`, :func:`reduce_and_finish`;
the Triton one is ``triton_stats.py``). The math per token row, the packed partial sums, autograd
and working memory: docs/parallel.md, "``token_stats``".
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.kernels.partials import POWER_SUMS
from opefo_nemo.parallel.groups import VocabShard


@dataclass
class ChunkStats:
    """Per-token results of one chunk, all fp32 ``[c]``."""

    row_max: Tensor  # m, the raw (unscaled) global row max
    log_sum_exp: Tensor  # log S0
    logprob: Tensor
    entropy: Tensor
    sums: dict[str, Tensor]  # the vocabulary sums of the requested powers, by TokenStats name
    local_bad: Tensor  # bool: this shard's slice of the row holds NaN or +inf


class ShardWidthError(ValueError):
    """The vocabulary shards of a TP group do not all have the same width."""


def target_in_shard(targets: Tensor, shard: VocabShard) -> tuple[Tensor, Tensor]:
    """``(owned [c] bool, local column [c] clamped into the shard)`` of global ``targets``."""
    local = targets - shard.start
    owned = (local >= 0) & (local < shard.valid)
    return owned, local.clamp(0, max(shard.valid - 1, 0))


def _shifted(logits: Tensor, row_max: Tensor, inv_t: float) -> Tensor:
    """``d = (z - m) / T`` as a new fp32 ``[c, valid]`` tensor (the chunk's fp32 copy)."""
    # Upcast first, then shift in place: a mixed-dtype ``logits - row_max`` would allocate a
    # second fp32 temporary on CPU.
    d = logits.to(torch.float32, copy=True).sub_(row_max[:, None])
    if inv_t != 1.0:
        d.mul_(inv_t)
    return d


def _all_reduce(t: Tensor, op: dist.ReduceOp.RedOpType, group: dist.ProcessGroup | None) -> None:
    if group is not None and dist.get_world_size(group) > 1:
        dist.all_reduce(t, op=op, group=group)


def local_row_max(logits: Tensor, shard: VocabShard) -> tuple[Tensor, Tensor]:
    """``(max of this shard's real columns [c] fp32, they hold NaN/+inf [c] bool)``;
    ``logits`` ``[c, valid]``, a shard without real columns gives ``−inf``."""
    if shard.valid > 0:
        local_max = logits.amax(dim=1).float()
    else:
        local_max = torch.full((logits.shape[0],), float("-inf"), device=logits.device)
    return local_max, torch.isnan(local_max) | (local_max == float("inf"))


def global_row_max(
    local_max: Tensor, shard: VocabShard, group: dist.ProcessGroup | None, check_widths: bool
) -> Tensor:
    """One all-reduce MAX of the shards' row maxima ``[c]`` fp32: the global row max ``m``.

    With ``check_widths`` the packet also carries ``(width, -width)`` so that every rank learns the
    largest and smallest shard width of the group and all fail together if they differ.
    """
    rows = local_max.shape[0]
    if check_widths:
        widths = torch.tensor([shard.width, -shard.width], dtype=torch.float32)
        packet = torch.cat([local_max, widths.to(local_max.device)])
        _all_reduce(packet, dist.ReduceOp.MAX, group)
        widest, narrowest = int(packet[rows]), -int(packet[rows + 1])
        if widest != narrowest:
            raise ShardWidthError(
                f"TP rank {shard.rank}: vocabulary shards of the group differ in width "
                f"({narrowest} to {widest} columns); the (padded) vocabulary must be divisible by "
                f"TP={shard.world}"
            )
        return packet[:rows]
    local_max = local_max.clone()
    _all_reduce(local_max, dist.ReduceOp.MAX, group)
    return local_max


def reduce_and_finish(
    partial: list[Tensor],
    row_max: Tensor,
    local_bad: Tensor,
    group: dist.ProcessGroup | None,
    powers: tuple[int, ...],
) -> ChunkStats:
    """One all-reduce SUM of the packed partial sums ``[S0, Σ e·d, d_y, (Σ e^k, Σ e^k·d)…]``
    (each ``[c]`` fp32, relative to the global ``row_max``, one pair per power in ``powers``),
    then, with ``p = e / S0``: ``logprob = d_y − log S0``, ``entropy = log S0 − Σ e·d / S0``,
    ``Σ p^k = Σ e^k / S0^k`` and ``Σ p^k log p = Σ e^k·d / S0^k − log S0 · Σ p^k``."""
    sums = torch.stack(partial, dim=1)
    _all_reduce(sums, dist.ReduceOp.SUM, group)
    s0, s_ed, d_y = sums[:, 0], sums[:, 1], sums[:, 2]
    log_s0 = torch.log(s0)
    vocab_sums = {}
    for i, k in enumerate(powers):
        s0_k = s0.pow(k)
        sum_pk = sums[:, 3 + 2 * i] / s0_k
        name_pk, name_pk_logp = POWER_SUMS[k]
        vocab_sums[name_pk] = sum_pk
        vocab_sums[name_pk_logp] = sums[:, 4 + 2 * i] / s0_k - log_s0 * sum_pk
    return ChunkStats(
        row_max=row_max,
        log_sum_exp=log_s0,
        logprob=d_y - log_s0,
        entropy=log_s0 - s_ed / s0,
        sums=vocab_sums,
        local_bad=local_bad,
    )


def _power_partials(d: Tensor, powers: tuple[int, ...]) -> list[Tensor]:
    """``[Σ e, Σ e·d, (Σ e^k, Σ e^k·d for k in powers)…]`` (each ``[c]``) of the shifted logits
    ``d`` ``[c, valid]`` fp32, which this overwrites; at most one more fp32 buffer of its size.
    ``e·d`` is taken as ``xlogy(e, e)``, so masked logits (``−inf``, ``e = 0``) add 0, not
    ``0 · −inf``."""
    if not powers:
        e = d.exp_()
        return [e.sum(1), e.xlogy_(e).sum(1)]
    e = torch.exp(d)
    e_d = torch.special.xlogy(e, e, out=d)
    partial = [e.sum(1), e_d.sum(1)]
    if 2 in powers:
        partial += [torch.einsum("ij,ij->i", e, e), torch.einsum("ij,ij->i", e, e_d)]
    if 3 in powers:
        e2_d = e_d.mul_(e)
        sum_e3_d = torch.einsum("ij,ij->i", e, e2_d)
        e2 = torch.mul(e, e, out=e2_d)
        partial += [torch.einsum("ij,ij->i", e, e2), sum_e3_d]
    return partial


def chunk_forward(
    logits: Tensor,
    targets: Tensor,
    shard: VocabShard,
    inv_t: float,
    group: dist.ProcessGroup | None,
    powers: tuple[int, ...],
    check_widths: bool,
) -> ChunkStats:
    """Statistics of one chunk: ``logits`` ``[c, width]`` (any float dtype), ``targets`` ``[c]``;
    ``powers`` (a subset of ``(2, 3)``): which vocabulary sums to add.

    Collective over ``group``: one all-reduce MAX, then one all-reduce SUM of
    ``[c, 3 + 2·len(powers)]`` fp32 partial sums.
    """
    logits = logits[:, : shard.valid]
    local_max, local_bad = local_row_max(logits, shard)
    row_max = global_row_max(local_max, shard, group, check_widths)
    d = _shifted(logits, row_max, inv_t)
    owned, local = target_in_shard(targets, shard)
    if shard.valid > 0:
        d_target = torch.where(owned, d.gather(1, local[:, None]).squeeze(1), 0.0)
    else:
        d_target = torch.zeros_like(row_max)
    sum_e, sum_e_d, *higher = _power_partials(d, powers)
    return reduce_and_finish([sum_e, sum_e_d, d_target, *higher], row_max, local_bad, group, powers)


def chunk_backward_into(
    out: Tensor,
    logits: Tensor,
    targets: Tensor,
    shard: VocabShard,
    inv_t: float,
    row_max: Tensor,
    log_sum_exp: Tensor,
    entropy: Tensor,
    grad_logprob: Tensor | None,
    grad_entropy: Tensor | None,
) -> None:
    """Write the gradient w.r.t. ``logits`` ``[c, width]`` into ``out`` (same shape, the logits'
    dtype; padded columns 0), recomputed from ``logits`` in one fp32 ``[c, valid]`` buffer.

    ``(g_l onehot(y) - p (g_l + g_H (log p + H))) / T`` with ``p`` rebuilt from the saved global
    row max and ``log S0``; ``grad_logprob``/``grad_entropy`` ``[c]`` or ``None`` (zero).
    """
    logits = logits[:, : shard.valid]
    log_p = _shifted(logits, row_max, inv_t).sub_(log_sum_exp[:, None])
    if grad_entropy is None:
        assert grad_logprob is not None  # the autograd function passes at least one
        grad = log_p.exp_().mul_(-grad_logprob[:, None])
    else:
        coef = grad_entropy * entropy
        if grad_logprob is not None:
            coef = coef + grad_logprob
        p = torch.exp(log_p)
        grad = torch.special.xlogy(p, p, out=log_p).mul_(grad_entropy[:, None])
        grad.addcmul_(p, coef[:, None]).neg_()
    if grad_logprob is not None and shard.valid > 0:
        owned, local = target_in_shard(targets, shard)
        grad.scatter_add_(1, local[:, None], torch.where(owned, grad_logprob, 0.0)[:, None])
    if inv_t != 1.0:
        grad.mul_(inv_t)
    out[:, : shard.valid] = grad
    out[:, shard.valid :] = 0
