"""``linear_token_stats``: the token statistics from hidden states and the output weight shard,
fused with the vocabulary projection so the logits are never stored (spec §1; docs/kernels.md,
"``linear_token_stats``"). Importing this module imports Triton.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.kernels import resolve_stats_kernel
from opefo_nemo.kernels.linear_stats import LinearBlocks, linear_grads, linear_partials
from opefo_nemo.kernels.partials import powers_of, requested_sums
from opefo_nemo.parallel.groups import VocabShard
from opefo_nemo.parallel.token_stats import TokenStats, check_finite, check_targets
from opefo_nemo.parallel.triton_stats import finish_partials, local_target, row_stats


@dataclass(frozen=True)
class _LinearPlan:
    shard: VocabShard
    inv_t: float
    group: dist.ProcessGroup | None
    sums: tuple[str, ...]  # the requested vocabulary sums, in VOCAB_SUMS order
    blocks: LinearBlocks | None  # None: the kernels' own defaults


def _stats(hidden: Tensor, weight: Tensor, target: Tensor, plan: _LinearPlan):
    powers = powers_of(plan.sums)
    partials = linear_partials(
        hidden, weight, target, plan.shard.valid, plan.inv_t, powers, plan.blocks
    )
    check_widths = plan.shard.world > 1
    return finish_partials(
        partials, target >= 0, plan.shard, plan.inv_t, plan.group, powers, check_widths
    )


class _LinearTokenStats(torch.autograd.Function):
    """Autograd for ``logprob`` and ``entropy`` w.r.t. ``hidden`` and ``weight``; backward
    recomputes the logit tiles from the saved inputs and the global row statistics."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, target: Tensor, plan: _LinearPlan):
        chunk = _stats(hidden, weight, target, plan)
        outputs = (chunk.logprob, chunk.entropy, chunk.local_bad)
        outputs += tuple(chunk.sums[name] for name in plan.sums)
        ctx.save_for_backward(hidden, weight, target, chunk.row_max, chunk.log_sum_exp, outputs[1])
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*outputs[2:])
        return outputs

    @staticmethod
    def backward(ctx, grad_logprob: Tensor | None, grad_entropy: Tensor | None, *_):
        if grad_logprob is None and grad_entropy is None:
            return None, None, None, None
        hidden, weight, target, row_max, log_sum_exp, entropy = ctx.saved_tensors
        plan: _LinearPlan = ctx.plan
        grad_hidden, grad_weight = linear_grads(
            hidden,
            weight,
            target,
            plan.shard.valid,
            plan.inv_t,
            row_stats(row_max, log_sum_exp, entropy, grad_logprob, grad_entropy),
            need_hidden=ctx.needs_input_grad[0],
            need_weight=ctx.needs_input_grad[1],
            blocks=plan.blocks,
        )
        return grad_hidden, grad_weight, None, None


def linear_token_stats(
    hidden: Tensor,
    weight: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    group: dist.ProcessGroup | None = None,
    vocab_size: int | None = None,
    sums: Sequence[str] = (),
    blocks: LinearBlocks | None = None,
) -> TokenStats:
    """Per-token statistics of ``softmax(hidden @ weightᵀ / T)`` over the (vocab-parallel)
    vocabulary, without forming the logits: the same statistics, collectives and errors as
    :func:`~opefo_nemo.parallel.token_stats` of ``logits = hidden @ weightᵀ``, with memory
    ``O(tokens)`` fp32 vectors beside the inputs (backward: fp32 gradient buffers of the inputs'
    sizes) and no chunking. Per call: one all-reduce MAX and one SUM in forward, none in backward.

    Args:
        hidden: final hidden states ``[tokens, h]`` or ``[d0, d1, h]`` (any two leading dims, e.g.
            megatron's ``[seq, batch, h]`` after the sequence-parallel gather), the same on every
            rank of ``group``; bf16/fp16/fp32.
        weight: this rank's output-layer shard ``[V/TP, h]``, the dtype of ``hidden`` (rank ``r``
            holds rows ``[r·V/TP, (r+1)·V/TP)`` of the padded vocabulary).
        targets: int64 global vocabulary ids shaped like ``hidden[..., 0]``.
        temperature, group, vocab_size, sums: as for ``token_stats``.
        blocks: tile sizes of the forward and the backward kernels (default: each kernel's own,
            ``FORWARD_BLOCKS`` and ``GRAD_BLOCKS`` of :mod:`opefo_nemo.kernels.linear_stats`).

    Returns ``TokenStats`` shaped like ``targets``; ``logprob`` and ``entropy`` differentiable
    w.r.t. ``hidden`` and ``weight``. The gradient w.r.t. ``hidden`` is this rank's share: the
    caller's layer sums it over the TP group, as megatron-core's ``ColumnParallelLinear`` backward
    does for its input. Runs on CUDA tensors (CPU tensors under ``TRITON_INTERPRET=1``).

    Raises: as ``token_stats`` (``ValueError`` for targets, shapes, ``vocab_size`` and shard
    widths; ``NonFiniteLogitsError`` for NaN/``+inf`` logits), ``TypeError`` for mixed dtypes.
    """
    if hidden.dim() not in (2, 3) or tuple(targets.shape) != tuple(hidden.shape[:-1]):
        raise ValueError(
            f"expected hidden [tokens, h] or [d0, d1, h] and targets of the leading shape, got "
            f"hidden {tuple(hidden.shape)} and targets {tuple(targets.shape)}"
        )
    if weight.dim() != 2 or weight.shape[1] != hidden.shape[-1]:
        raise ValueError(f"expected weight [V/TP, {hidden.shape[-1]}], got {tuple(weight.shape)}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    wanted = requested_sums(sums)
    resolve_stats_kernel("triton", hidden.is_cuda)
    shard = VocabShard.of(weight.shape[0], group, vocab_size)
    check_targets(targets, shard.vocab_size)
    plan = _LinearPlan(shard, 1.0 / temperature, group, wanted, blocks)
    flat_hidden = hidden.reshape(-1, hidden.shape[-1])
    target = local_target(targets.reshape(-1).long(), shard)
    if torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad):
        outs = _LinearTokenStats.apply(flat_hidden, weight, target, plan)
    else:
        chunk = _stats(flat_hidden, weight, target, plan)
        outs = (chunk.logprob, chunk.entropy, chunk.local_bad)
        outs += tuple(chunk.sums[name] for name in wanted)
    values = dict(zip(("logprob", "entropy", "local_bad", *wanted), outs, strict=True))
    local_bad = values.pop("local_bad")
    stats = TokenStats(**values).map(lambda t: t.reshape(targets.shape))
    check_finite(stats, local_bad, shard)
    return stats
