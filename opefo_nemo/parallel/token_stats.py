"""``token_stats``: fused, chunked, vocab-parallel per-token statistics with autograd (spec §1;
docs/parallel.md). This module checks the input, picks the implementation (``vocab_stats`` or
``triton_stats``), loops over token chunks, wires autograd and turns non-finite results into errors.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields

import torch
import torch.distributed as dist
from torch import Tensor

from opefo_nemo.core.deferred_checks import active_checks
from opefo_nemo.kernels import resolve_stats_kernel
from opefo_nemo.kernels.partials import powers_of, requested_sums
from opefo_nemo.parallel import vocab_stats
from opefo_nemo.parallel.groups import VocabShard
from opefo_nemo.parallel.vocab_stats import ChunkStats

#: Default chunk: as many tokens as fit this many bytes of fp32 ``[tokens, V/TP]`` working buffer.
DEFAULT_CHUNK_BYTES = 256 * 2**20


@dataclass(frozen=True)
class TokenStats:
    """Per-token statistics, fp32, shaped like the targets (``[tokens]`` or ``[batch, seq]``).

    ``logprob`` = log π(y_t) and ``entropy`` = H_t carry autograd when the logits do. The
    vocabulary sums ``sum_p2`` = Σ_a π(a)², ``sum_p2_logp`` = Σ_a π(a)² log π(a), ``sum_p3`` =
    Σ_a π(a)³ and ``sum_p3_logp`` = Σ_a π(a)³ log π(a) are ``None`` unless requested
    (``token_stats(sums=...)``) and never carry gradient.
    """

    logprob: Tensor
    entropy: Tensor
    sum_p2: Tensor | None = None
    sum_p2_logp: Tensor | None = None
    sum_p3: Tensor | None = None
    sum_p3_logp: Tensor | None = None

    def present(self) -> dict[str, Tensor]:
        """The statistics that are not ``None``, by field name, in field order."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        return {name: value for name, value in values.items() if value is not None}

    def map(self, fn: Callable[[Tensor], Tensor]) -> TokenStats:
        """The same statistics with ``fn`` applied to each present one (absent ones stay absent)."""
        return TokenStats(**{name: fn(value) for name, value in self.present().items()})


class NonFiniteLogitsError(FloatingPointError):
    """NaN or +inf logits reached the token statistics."""


@dataclass(frozen=True)
class _Plan:
    shard: VocabShard
    inv_t: float
    group: dist.ProcessGroup | None
    sums: tuple[str, ...]  # the requested vocabulary sums, in VOCAB_SUMS order
    chunk_size: int
    chunk_forward: Callable[..., ChunkStats]  # vocab_stats.chunk_forward's signature
    chunk_backward_into: Callable[..., None]  # vocab_stats.chunk_backward_into's signature


def _chunk_steps(kernel: str) -> tuple[Callable[..., ChunkStats], Callable[..., None]]:
    """The ``(chunk_forward, chunk_backward_into)`` of a resolved kernel (``torch``/``triton``);
    Triton is imported only here, when it is chosen."""
    if kernel == "torch":
        return vocab_stats.chunk_forward, vocab_stats.chunk_backward_into
    from opefo_nemo.parallel import triton_stats

    return triton_stats.chunk_forward, triton_stats.chunk_backward_into


def _forward(logits: Tensor, targets: Tensor, plan: _Plan) -> tuple[ChunkStats, ...]:
    check_widths = plan.shard.world > 1
    chunks = []
    for start in range(0, logits.shape[0], plan.chunk_size):
        rows = slice(start, start + plan.chunk_size)
        chunks.append(
            plan.chunk_forward(
                logits[rows],
                targets[rows],
                plan.shard,
                plan.inv_t,
                plan.group,
                powers_of(plan.sums),
                check_widths,
            )
        )
        check_widths = False
    return tuple(chunks)


def _cat(chunks: tuple[ChunkStats, ...], field: str, like: Tensor) -> Tensor:
    """A field of the chunks (a ``ChunkStats`` attribute or a vocabulary sum's name), joined."""
    parts = [c.sums[field] if field in c.sums else getattr(c, field) for c in chunks]
    return torch.cat(parts) if parts else torch.empty(0, dtype=torch.float32, device=like.device)


class _VocabParallelTokenStats(torch.autograd.Function):
    """Autograd for ``logprob`` and ``entropy``; backward recomputes ``p`` chunk by chunk from the
    saved input logits and the saved global row statistics (no fp32 softmax is kept)."""

    @staticmethod
    def forward(ctx, logits: Tensor, targets: Tensor, plan: _Plan):
        chunks = _forward(logits, targets, plan)
        names = ("logprob", "entropy", "local_bad", *plan.sums)
        outputs = tuple(_cat(chunks, name, logits) for name in names)
        ctx.save_for_backward(
            logits,
            targets,
            _cat(chunks, "row_max", logits),
            _cat(chunks, "log_sum_exp", logits),
            outputs[1],
        )
        ctx.plan = plan
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*outputs[2:])
        return outputs

    @staticmethod
    def backward(ctx, grad_logprob: Tensor | None, grad_entropy: Tensor | None, *_):
        if grad_logprob is None and grad_entropy is None:
            return None, None, None
        logits, targets, row_max, log_sum_exp, entropy = ctx.saved_tensors
        plan: _Plan = ctx.plan
        grad = torch.empty_like(logits)
        for start in range(0, logits.shape[0], plan.chunk_size):
            rows = slice(start, start + plan.chunk_size)
            plan.chunk_backward_into(
                grad[rows],
                logits[rows],
                targets[rows],
                plan.shard,
                plan.inv_t,
                row_max[rows],
                log_sum_exp[rows],
                entropy[rows],
                None if grad_logprob is None else grad_logprob[rows],
                None if grad_entropy is None else grad_entropy[rows],
            )
        return grad, None, None


def check_targets(targets: Tensor, vocab_size: int) -> None:
    """Raise ``ValueError`` for a target outside ``[0, vocab_size)``; inside
    :func:`~opefo_nemo.core.deferred_checks.deferred_checks` the check is recorded on the device
    instead (the kernels clamp such targets, so the pass can run on)."""
    if targets.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"targets must be int64 vocabulary ids, got {targets.dtype}")
    bad = (targets < 0) | (targets >= vocab_size)
    checks = active_checks()
    if checks is not None:
        checks.record(bad.sum(), lambda: _target_error(targets, bad, vocab_size))
    elif bool(bad.any()):
        raise _target_error(targets, bad, vocab_size)


def _target_error(targets: Tensor, bad: Tensor, vocab_size: int) -> ValueError:
    where = int(torch.nonzero(bad.reshape(-1))[0].item())
    return ValueError(
        f"target id {int(targets.reshape(-1)[where])} at flat position {where} is outside the "
        f"vocabulary [0, {vocab_size}) ({int(bad.sum())} such targets)"
    )


def check_finite(stats: TokenStats, local_bad: Tensor, shard: VocabShard) -> None:
    """Raise if any token's statistics are NaN: from the per-token outputs, not the logits.
    Inside :func:`~opefo_nemo.core.deferred_checks.deferred_checks` the check is recorded on the
    device instead."""
    bad = torch.isnan(stats.logprob.detach()) | ~torch.isfinite(stats.entropy.detach())
    global_rank = dist.get_rank() if dist.is_initialized() else 0

    def error() -> NonFiniteLogitsError:
        return NonFiniteLogitsError(
            f"token_stats on TP rank {shard.rank} (global rank {global_rank}): {int(bad.sum())} "
            f"tokens have non-finite statistics from NaN or +inf logits (or no finite logit); "
            f"{int(local_bad.sum())} of them have NaN/+inf logits in this rank's vocabulary "
            f"columns [{shard.start}, {shard.start + shard.width})"
        )

    checks = active_checks()
    if checks is not None:
        checks.record(bad.sum(), error)
    elif bool(bad.any()):
        raise error()


def token_stats(
    logits: Tensor,
    targets: Tensor,
    *,
    temperature: float = 1.0,
    group: dist.ProcessGroup | None = None,
    vocab_size: int | None = None,
    sums: Sequence[str] = (),
    chunk_size: int | None = None,
    kernel: str = "auto",
) -> TokenStats:
    """Per-token ``logprob``, ``entropy`` and the requested vocabulary sums of ``targets``.

    Args:
        logits: this rank's vocabulary slice, ``[tokens, V/TP]`` or ``[batch, seq, V/TP]``,
            bf16/fp16/fp32 (megatron-core's output layer with ``parallel_output=True``). All
            statistics are of ``softmax(logits / temperature)`` computed in fp32.
        targets: int64 global vocabulary ids, ``[tokens]`` or ``[batch, seq]``; the same on every
            rank of ``group``.
        temperature: sampling temperature ``T > 0``.
        group: the tensor-parallel group (megatron-core's or a plain one); ``None`` = TP 1.
        vocab_size: the true vocabulary size; columns with global index ``>= vocab_size`` are
            padding and excluded. Default: no padding (``V/TP × TP``).
        sums: vocabulary sums to add, any of ``sum_p2`` (Σπ²), ``sum_p2_logp`` (Σπ² log π),
            ``sum_p3`` (Σπ³), ``sum_p3_logp`` (Σπ³ log π), e.g.
            ``core.entropy_flow.ESTIMATOR_SUMS[estimator]``; no gradient. Each power of π asked
            for adds two columns to the one all-reduce SUM; ``()`` adds none.
        chunk_size: tokens per chunk; default: for ``torch`` as many as fit
            ``DEFAULT_CHUNK_BYTES`` of fp32 working buffer, for ``triton`` (which has none) all.
        kernel: ``torch``, ``triton`` (CUDA tensors; CPU ones under ``TRITON_INTERPRET=1``) or
            ``auto`` (``triton`` on CUDA when it imports, else ``torch``): the same statistics,
            collectives and gradients (docs/kernels.md).

    Communication per chunk: one all-reduce MAX and one all-reduce SUM of a packed tensor; the
    vocabulary is never gathered. With grad enabled and ``logits.requires_grad`` the result is
    differentiable in ``logprob`` and ``entropy``; otherwise no graph is built.

    Raises:
        ValueError: a target outside ``[0, vocab_size)``, a bad shape, ``vocab_size`` larger than
            the sharded vocabulary, shards of different widths across the group, an unknown
            name in ``sums``, or a ``kernel`` that cannot run here.
        NonFiniteLogitsError: NaN or +inf logits (on every rank of the group, naming the count).
    """
    if logits.dim() not in (2, 3) or tuple(targets.shape) != tuple(logits.shape[:-1]):
        raise ValueError(
            f"expected logits [tokens, V/TP] or [batch, seq, V/TP] and targets of the leading "
            f"shape, got logits {tuple(logits.shape)} and targets {tuple(targets.shape)}"
        )
    if not logits.is_floating_point():
        raise TypeError(f"logits must be floating point, got {logits.dtype}")
    if not temperature > 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    wanted = requested_sums(sums)
    width = logits.shape[-1]
    shard = VocabShard.of(width, group, vocab_size)
    check_targets(targets, shard.vocab_size)
    resolved = resolve_stats_kernel(kernel, logits.is_cuda)
    flat_logits = logits.reshape(-1, width)
    if chunk_size is None:
        budget = DEFAULT_CHUNK_BYTES // (4 * max(width, 1))
        chunk_size = max(1, budget if resolved == "torch" else flat_logits.shape[0])
    if chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    plan = _Plan(shard, 1.0 / temperature, group, wanted, chunk_size, *_chunk_steps(resolved))
    flat_targets = targets.reshape(-1).long()
    names = ("logprob", "entropy", "local_bad", *wanted)
    if torch.is_grad_enabled() and logits.requires_grad:
        outs = _VocabParallelTokenStats.apply(flat_logits, flat_targets, plan)
    else:
        chunks = _forward(flat_logits, flat_targets, plan)
        outs = tuple(_cat(chunks, name, logits) for name in names)
    values = dict(zip(names, outs, strict=True))
    local_bad = values.pop("local_bad")
    stats = TokenStats(**values).map(lambda t: t.reshape(targets.shape))
    check_finite(stats, local_bad, shard)
    return stats
