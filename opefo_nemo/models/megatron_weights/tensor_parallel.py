"""Split a full Megatron weight into its tensor-parallel shards, and gather them back, by its
:class:`~.weight_mapping.Sharding` (docs/megatron.md, "Weight mapping").
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from opefo_nemo.models.megatron_weights.weight_mapping import Sharding


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
    With ``n`` the rows or columns of the full tensor: ``COLUMN`` rows ``r·n/TP … (r+1)·n/TP − 1``
    (for the fused QKV whole key/value groups, Megatron's row order being group-major; when
    ``TP > G`` each group's rows over ``TP/G`` ranks; for the embedding and output layer the
    rank's slice of the padded vocabulary); ``GATED_COLUMN`` ``[gate_r; up_r]``, so each rank's
    SwiGLU pairs its own gate and up rows; ``ROW`` the same blocks of columns; ``REPLICATED`` the
    whole tensor.

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
