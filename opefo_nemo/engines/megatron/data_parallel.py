"""Data-parallel sharding of the rollout batch: each DP rank trains on its own responses.

Rank ``r`` of ``D`` data-parallel ranks gets the contiguous rows ``r·B/D … (r+1)·B/D − 1`` of the
``B`` responses of the batch: whole responses (a response's tokens never span ranks), disjoint,
together the whole batch. (NeMo-Aligner 0.7.0's REINFORCE ``chunk()`` leaves the whole batch on
every rank; here each rank holds ``1/D`` of it.) ``B`` must be divisible by ``D``: every rank runs
the same number of micro-batches, which megatron-core's schedule and the gradient all-reduce need.

The shard keeps the batch's global ``token_ids`` (``row · (T − 1) + t`` of the *whole* batch),
so Clip-Cov / KL-Cov selections, which order tokens by these ids (SPEC §5), do not depend on the
layout. Its tensors are trimmed to its own longest row (``TrainBatch.select``).
"""

from __future__ import annotations

import torch.distributed as dist

from ..batch import TrainBatch


def shard_rows(rows: int, dp_size: int, dp_rank: int) -> range:
    """The rows of a ``rows``-response batch that data-parallel rank ``dp_rank`` of ``dp_size``
    trains on; raises ``ValueError`` if ``rows`` is not divisible by ``dp_size``."""
    if dp_size < 1:
        raise ValueError(f"data-parallel size must be >= 1, got {dp_size}")
    if not 0 <= dp_rank < dp_size:
        raise ValueError(f"data-parallel rank {dp_rank} is outside 0 … {dp_size - 1}")
    if rows % dp_size:
        raise ValueError(
            f"a rollout batch of {rows} responses does not split evenly over {dp_size} "
            "data-parallel ranks: make prompts_per_step × responses_per_prompt a multiple of "
            "the data-parallel size"
        )
    each = rows // dp_size
    return range(dp_rank * each, (dp_rank + 1) * each)


def shard_batch(batch: TrainBatch, dp_size: int, dp_rank: int) -> TrainBatch:
    """This rank's share of ``batch`` (module docstring), global token ids preserved."""
    return batch.select(shard_rows(batch.rows, dp_size, dp_rank))


def shard_for_group(batch: TrainBatch, group: dist.ProcessGroup | None) -> TrainBatch:
    """:func:`shard_batch` for this process's rank in the data-parallel ``group``
    (megatron-core's ``parallel_state.get_data_parallel_group()``; ``None``: the default group)."""
    return shard_batch(batch, dist.get_world_size(group), dist.get_rank(group))
