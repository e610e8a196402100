"""The chunk steps of ``token_stats`` on the Triton kernels of ``opefo_nemo.kernels``: the same
contract and collectives as the torch steps of ``vocab_stats`` (docs/kernels.md,
"``token_stats(kernel="triton")``"). Importing this module imports Triton: ``token_stats`` does
so only when the kernel is chosen.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.kernels.logits_stats import shard_logits_grad, shard_partials
from opefo_nemo.kernels.partials import ShardPartials, to_global_max
from opefo_nemo.parallel.groups import VocabShard
from opefo_nemo.parallel.vocab_stats import (
    ChunkStats,
    global_row_max,
    reduce_and_finish,
    target_in_shard,
)


def local_target(targets: Tensor, shard: VocabShard) -> Tensor:
    """The targets' columns in this shard ``[c]`` int64, −1 where another shard owns them."""
    owned, local = target_in_shard(targets, shard)
    return torch.where(owned, local, -1)


def finish_partials(
    partials: ShardPartials,
    owned: Tensor,
    shard: VocabShard,
    inv_t: float,
    group: dist.ProcessGroup | None,
    powers: tuple[int, ...],
    check_widths: bool,
) -> ChunkStats:
    """The two collectives and the statistics from one shard's :class:`ShardPartials`: one
    all-reduce MAX of the row maxima (with the shard-width check on the first chunk), the local
    sums moved to the global max (:func:`~opefo_nemo.kernels.partials.to_global_max`), one
    all-reduce SUM of the packed ``[S0, Σ e·d, d_y, (Σ e^k, Σ e^k·d)…]``; a row whose real
    columns hold NaN or ``+inf`` on some rank contributes NaN there, so every rank sees it.
    ``owned`` ``[c]`` bool: this shard holds the target; ``powers``: the pairs of sums
    (``kernels.partials``) that go into the packet beside ``S0``, ``S1`` and ``d_y``."""
    row_max = global_row_max(partials.local_max, shard, group, check_widths)
    sums = to_global_max(partials, row_max, inv_t)
    d_target = torch.where(owned, (partials.target_logit - row_max) * inv_t, 0.0)
    partial = [sums[:, 0], sums[:, 1], d_target]
    for k in powers:
        partial += [sums[:, 2 * k - 2], sums[:, 2 * k - 1]]
    partial = [torch.where(partials.bad, float("nan"), t) for t in partial]
    return reduce_and_finish(partial, row_max, partials.bad, group, powers)


def chunk_forward(
    logits: Tensor,
    targets: Tensor,
    shard: VocabShard,
    inv_t: float,
    group: dist.ProcessGroup | None,
    powers: tuple[int, ...],
    check_widths: bool,
) -> ChunkStats:
    """``vocab_stats.chunk_forward`` on the Triton kernel: ``logits`` ``[c, width]``."""
    target = local_target(targets, shard)
    partials = shard_partials(logits, target, shard.valid, inv_t, powers)
    return finish_partials(partials, target >= 0, shard, inv_t, group, powers, check_widths)


def row_stats(
    row_max: Tensor,
    log_sum_exp: Tensor,
    entropy: Tensor,
    grad_logprob: Tensor | None,
    grad_entropy: Tensor | None,
) -> Tensor:
    """``[c, 5]`` fp32 ``[m, log S0, H, g_l, g_H]`` for the gradient kernels (absent → 0), which
    read it with ``kernels/tiles.py``'s ``load_row_stats``."""
    zeros = torch.zeros_like(row_max)
    g_l = zeros if grad_logprob is None else grad_logprob.float()
    g_h = zeros if grad_entropy is None else grad_entropy.float()
    return torch.stack([row_max, log_sum_exp, entropy.float(), g_l, g_h], dim=1)


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
    """``vocab_stats.chunk_backward_into`` on the Triton kernel (one read, one write)."""
    stats = row_stats(row_max, log_sum_exp, entropy, grad_logprob, grad_entropy)
    shard_logits_grad(logits, local_target(targets, shard), shard.valid, inv_t, stats, out=out)
