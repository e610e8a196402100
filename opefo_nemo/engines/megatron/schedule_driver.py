"""Driving megatron-core's ``forward_backward_func`` over a list of micro-batches, and moving
per-row results between data-parallel ranks (docs/megatron.md, "One step's data path")."""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from torch import Tensor

from opefo_nemo.engines.megatron.loss_closure import LossFunction
from opefo_nemo.engines.megatron.pipeline_batch import PipelineMicroBatches, forward_step_func


def run_schedule(
    model: torch.nn.Module,
    micros: PipelineMicroBatches,
    make_fn: Callable[[Mapping[str, Tensor]], LossFunction],
    forward_only: bool,
    stop_before_output_layer: bool = False,
) -> list[dict[str, Tensor]]:
    """One pass of ``get_forward_backward_func()`` (megatron-core 0.16.1: the no-pipelining
    schedule at PP = 1, the non-interleaved 1F1B one at PP > 1) over ``micros`` (forward and,
    unless ``forward_only``, backward with gradient accumulation) on this rank's pipeline stage.
    The first stage reads the tokens and positions ``0 … T − 1`` with no attention mask (causal
    only: right padding never reaches a real token's prefix). ``make_fn(item)`` gives the last
    stage's loss/stats function of an item, in micro-batch order; returns the schedule's
    per-micro-batch ``reduced`` mappings (last stage). With
    ``stop_before_output_layer`` the last stage's functions receive the final hidden states
    instead of the logits (``engine.stats_kernel=fused_linear``)."""
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    schedule = get_forward_backward_func()
    return schedule(
        forward_step_func=forward_step_func(make_fn, last, stop_before_output_layer),
        data_iterator=iter(micros.stats_items(first, last)),
        model=model,
        num_microbatches=micros.num_microbatches,
        seq_length=micros.seq_length,
        micro_batch_size=micros.micro_batch_size,
        forward_only=forward_only,
    )


def balanced_rows(rows: int, size: int, rank: int) -> range:
    """Contiguous rows ``⌊r·B/D⌋ … ⌊(r+1)·B/D⌋ − 1`` of ``B`` for rank ``r`` of ``D``.

    Equal shares when ``D`` divides ``B``; otherwise the shares differ by at most one row (some
    may be empty). A forward-only pass needs no equal shares:
    no gradient is reduced and each data-parallel rank runs its own schedule.
    """
    return range(rank * rows // size, (rank + 1) * rows // size)


def gather_rows(local: Tensor, rows: int, group: dist.ProcessGroup) -> Tensor:
    """``[F, B, W]``: every rank's ``local`` ``[F, r_rank, W]`` (its :func:`balanced_rows` of
    ``rows``) gathered over ``group`` in rank order; one all-gather (shares padded to the
    largest)."""
    size = dist.get_world_size(group)
    if size == 1:
        return local
    shares = [balanced_rows(rows, size, rank) for rank in range(size)]
    largest = max(len(share) for share in shares)
    padded = local.new_zeros((local.shape[0], largest, local.shape[2]))
    padded[:, : local.shape[1]] = local
    parts = [torch.empty_like(padded) for _ in range(size)]
    dist.all_gather(parts, padded, group=group)
    return torch.cat(
        [part[:, : len(share)] for part, share in zip(parts, shares, strict=True)], dim=1
    )


def per_rank(count: int, size: int) -> Callable[[int], range]:
    """``rank → indices`` of ``count`` micro-batches in equal contiguous blocks over ``size``
    data-parallel ranks; raises ``ValueError`` when ``size`` does not divide ``count``."""
    if count % size:
        raise ValueError(
            f"{count} micro-batches do not split evenly over {size} data-parallel ranks: every "
            "rank runs the same number of backward passes before the gradient all-reduce (make "
            "the step's responses a multiple of micro_batch_size × data-parallel size)"
        )
    each = count // size
    return lambda rank: range(rank * each, (rank + 1) * each)
