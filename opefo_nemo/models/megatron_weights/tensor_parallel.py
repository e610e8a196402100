"""Split a full Megatron weight into its tensor-parallel shards, and gather them back.

For ``TP`` ranks, rank ``r`` holds (``n`` = rows or columns of the full tensor):

- ``COLUMN``: rows ``r·n/TP … (r+1)·n/TP − 1``. For the fused QKV this is whole key/value groups
  (``G/TP`` of them, with their query heads), because Megatron's row order is group-major; when
  ``TP > G`` each group's rows are split over ``TP/G`` ranks (Megatron's attention all-gathers
  them back at run time). For the embedding and output layer it is the rank's slice of the
  padded vocabulary.
- ``GATED_COLUMN``: ``[gate_r; up_r]``: the rank's row block of the gate half, then of the up half
  (not a flat row block of ``[gate; up]``), so each rank's SwiGLU pairs its own gate and up rows.
- ``ROW``: columns ``r·n/TP … (r+1)·n/TP − 1`` (``linear_proj``, ``linear_fc2``).
- ``REPLICATED``: the whole tensor.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from .weight_mapping import Sharding


def _blocks(tensor: Tensor, dim: int, parts: int, what: str) -> tuple[Tensor, ...]:
    if tensor.shape[dim] % parts:
        raise ValueError(
            f"{what}: dimension {dim} of size {tensor.shape[dim]} does not split into {parts} "
            "equal tensor-parallel shards"
        )
    return tensor.chunk(parts, dim=dim)


def split_for_rank(
    tensor: Tensor, sharding: Sharding, world: int, rank: int, what: str = "weight"
) -> Tensor:
    """The shard of the full ``tensor`` that tensor-parallel ``rank`` of ``world`` holds (a copy).

    ``what`` names the weight in error messages.
    """
    if not 0 <= rank < world:
        raise ValueError(f"{what}: tensor-parallel rank {rank} is outside 0 … {world - 1}")
    if sharding is Sharding.REPLICATED:
        return tensor.clone()
    if sharding is Sharding.ROW:
        return _blocks(tensor, 1, world, what)[rank].clone()
    if sharding is Sharding.COLUMN:
        return _blocks(tensor, 0, world, what)[rank].clone()
    halves = _blocks(tensor, 0, 2, what)
    return torch.cat([_blocks(half, 0, world, what)[rank] for half in halves], dim=0)


def gather_shards(shards: Sequence[Tensor], sharding: Sharding, what: str = "weight") -> Tensor:
    """The full tensor from the shards of all ranks in rank order (inverse of
    :func:`split_for_rank`). For ``REPLICATED`` the shards must agree; rank 0's is returned."""
    if not shards:
        raise ValueError(f"{what}: no shards to gather")
    if sharding is Sharding.REPLICATED:
        return shards[0]
    if sharding is Sharding.ROW:
        return torch.cat(list(shards), dim=1)
    if sharding is Sharding.COLUMN:
        return torch.cat(list(shards), dim=0)
    halves = [_blocks(shard, 0, 2, what) for shard in shards]
    return torch.cat([half[0] for half in halves] + [half[1] for half in halves], dim=0)
