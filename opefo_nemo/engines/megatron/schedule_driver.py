"""Driving megatron-core's ``forward_backward_func`` over a list of micro-batches, which
data-parallel rank runs which micro-batch, and moving per-row results between data-parallel ranks
(docs/megatron.md, "One step's data path")."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.utils import get_model_config
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
    """One pass of ``get_forward_backward_func()`` (the no-pipelining schedule at PP = 1, the
    non-interleaved 1F1B one at PP > 1) over ``micros`` (forward and, unless ``forward_only``,
    backward with gradient accumulation) on this rank's pipeline stage, each micro-batch at its
    own shape. The first stage reads the tokens and positions ``0 … T_i − 1`` with no attention
    mask (causal only: right padding never reaches a real token's prefix). ``make_fn(item)``
    gives the last stage's loss/stats function of an item, in micro-batch order; returns the
    schedule's per-micro-batch ``reduced`` mappings (last stage). With
    ``stop_before_output_layer`` the last stage's functions receive the final hidden states
    instead of the logits (``engine.stats_kernel=fused_linear``).

    The model config's ``variable_seq_lengths`` is set for the pass to whether the shapes differ:
    the pipelined schedule then sends each activation's shape before it (``p2p_communication``
    ``_communicate_shapes``; megatron-core 0.11 and 0.16.1 alike), otherwise every transfer has
    the one shape given as ``seq_length`` and ``micro_batch_size`` (the first micro-batch's, the
    shape of all of them). Every stage of a pipeline runs the same micro-batches, so they agree.
    """
    first = parallel_state.is_pipeline_first_stage()
    last = parallel_state.is_pipeline_last_stage()
    get_model_config(model).variable_seq_lengths = micros.variable_shapes
    rows, seq_length = micros.shapes[0]
    schedule = get_forward_backward_func()
    return schedule(
        forward_step_func=forward_step_func(make_fn, last, stop_before_output_layer),
        data_iterator=iter(micros.stats_items(first, last)),
        model=model,
        num_microbatches=micros.num_microbatches,
        seq_length=seq_length,
        micro_batch_size=rows,
        forward_only=forward_only,
    )


def contiguous_owners(count: int, size: int) -> tuple[int, ...]:
    """The data-parallel rank of each of ``count`` micro-batches in equal contiguous blocks over
    ``size`` ranks (micro-batch ``i`` on rank ``⌊i·size/count⌋``); raises ``ValueError`` when
    ``size`` does not divide ``count``."""
    if count % size:
        raise ValueError(
            f"{count} micro-batches do not split evenly over {size} data-parallel ranks: give "
            "each micro-batch's rank (owners), or make the step's responses a multiple of "
            "micro_batch_size × data-parallel size"
        )
    return tuple(i * size // count for i in range(count))


def owned(owners: Sequence[int], count: int, size: int, rank: int) -> list[int]:
    """The indices ``i`` of ``count`` micro-batches that ``owners[i]`` gives to ``rank``, in
    order; ``owners`` must name a rank in ``0 … size − 1`` for each of them."""
    if len(owners) != count:
        raise ValueError(f"{len(owners)} owners for {count} micro-batches")
    strays = sorted({o for o in owners if not 0 <= o < size})
    if strays:
        raise ValueError(f"owners {strays} are not data-parallel ranks 0 … {size - 1}")
    return [i for i, owner in enumerate(owners) if owner == rank]


def gather_rows(
    local: Tensor, shares: Sequence[Sequence[int]], rows: int, group: dist.ProcessGroup
) -> Tensor:
    """``[F, rows, W]``: every rank ``r``'s ``local`` ``[F, len(shares[r]), W]`` put at the row
    indices ``shares[r]`` (together every row once); one all-gather over ``group``, each share
    padded to the largest."""
    size = dist.get_world_size(group)
    largest = max(len(share) for share in shares)
    padded = local.new_zeros((local.shape[0], largest, local.shape[2]))
    padded[:, : local.shape[1]] = local
    parts = [padded]
    if size > 1:
        parts = [torch.empty_like(padded) for _ in range(size)]
        dist.all_gather(parts, padded, group=group)
    full = local.new_zeros((local.shape[0], rows, local.shape[2]))
    for part, share in zip(parts, shares, strict=True):
        index = torch.as_tensor(share, dtype=torch.long, device=local.device)
        full[:, index] = part[:, : len(share)]
    return full
