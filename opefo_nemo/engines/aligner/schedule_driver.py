"""Driving megatron-core's ``forward_backward_func`` over a list of micro-batches, and moving
per-row results between data-parallel ranks.

- :func:`run_schedule`: ``get_forward_backward_func()`` (megatron-core 0.16.1 picks the
  no-pipelining schedule at PP = 1) over ``(input_ids [b, T], loss_fn)`` items; the model sees
  ``input_ids``, positions ``0 … T − 1`` and no attention mask (causal only: right padding never
  reaches a real token's prefix). Returns the schedule's per-micro-batch ``reduced`` mappings.
- :func:`balanced_rows`: the rows of a forward-only pass that a data-parallel rank computes.
- :func:`gather_rows`: per-row tensors of every data-parallel rank, back in batch order.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
import torch.distributed as dist
from megatron.core.pipeline_parallel import get_forward_backward_func
from torch import Tensor

from .loss_closure import LossFunction

ScheduleItem = tuple[Tensor, LossFunction]
"""``(input_ids [b, T] int64, fn)``: one micro-batch and its loss/stats function."""


def _forward_step(data_iterator, model: torch.nn.Module) -> tuple[Tensor, LossFunction]:
    """megatron's ``forward_step_func``: the next item's vocab-parallel logits ``[b, T, V/TP]``
    (``GPTModel.forward`` without labels) and its function."""
    input_ids, fn = next(data_iterator)
    device = next(model.parameters()).device
    input_ids = input_ids.to(device)
    positions = torch.arange(input_ids.shape[1], device=device).expand_as(input_ids)
    return model(input_ids, positions, None), fn


def run_schedule(
    model: torch.nn.Module, items: Sequence[ScheduleItem], forward_only: bool
) -> list[dict[str, Tensor]]:
    """One pass of megatron's schedule over ``items`` (forward and, unless ``forward_only``,
    backward with gradient accumulation); ``[]`` without running it when there are no items."""
    if not items:
        return []
    schedule = get_forward_backward_func()
    return schedule(
        forward_step_func=_forward_step,
        data_iterator=iter(items),
        model=model,
        num_microbatches=len(items),
        seq_length=max(ids.shape[1] for ids, _ in items),
        micro_batch_size=max(ids.shape[0] for ids, _ in items),
        forward_only=forward_only,
    )


def balanced_rows(rows: int, size: int, rank: int) -> range:
    """Contiguous rows ``⌊r·B/D⌋ … ⌊(r+1)·B/D⌋ − 1`` of ``B`` for rank ``r`` of ``D``.

    Equal to :func:`~.data_parallel.shard_rows` when ``D`` divides ``B``; otherwise the shares
    differ by at most one row (some may be empty). A forward-only pass needs no equal shares:
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


def gather_flat(local: Tensor, sizes: Sequence[int], group: dist.ProcessGroup) -> list[Tensor]:
    """Every rank's 1-d ``local`` (rank ``r``'s has ``sizes[r]`` elements), in rank order."""
    largest = max(sizes)
    padded = local.new_zeros(largest)
    padded[: local.numel()] = local
    parts = [torch.empty_like(padded) for _ in sizes]
    dist.all_gather(parts, padded, group=group)
    return [part[:n] for part, n in zip(parts, sizes, strict=True)]


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
